//! The store's layout and reading it: one directory per image, named by the image's name.
//!
//! ```text
//! <store>/<name>/rootfs/          the root file system, owned by root
//! <store>/<name>/manifest         every entry of rootfs (plimsoll-image-manifest/v1)
//! <store>/<name>/identity         "sha256:<hex>" of the manifest's bytes
//! <store>/<name>/disk.ext4        optional: the rootfs as an ext4 disk, for the VM provider
//! <store>/<name>/disk.identity    the identity the disk was made from (must equal identity)
//! ```
//!
//! Entries whose name starts with `.` (builds and imports under way, images being removed)
//! and directories without an identity are not images.

use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};

pub use plimsoll_wire::Language;
use plimsoll_wire::simulators::{IMAGE_INDEX, MAX_INDEX_BYTES, SimulatorEntry, SimulatorIndex};
use plimsoll_wire::{ImageInfo, ImageRef, is_image_identity, is_image_name};

/// Where an image lives in the store: its name and directory, before its identity is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageDir {
    /// Its name.
    pub name: String,
    /// `<store>/<name>`.
    pub dir: PathBuf,
}

impl ImageDir {
    /// Its root file system.
    pub fn rootfs(&self) -> PathBuf {
        self.dir.join("rootfs")
    }

    /// The identity its `identity` file holds now.
    pub fn read_identity(&self) -> Result<String, ResolveImageError> {
        let path = self.dir.join("identity");
        let text = fs::read_to_string(&path).map_err(|io| ResolveImageError::Broken {
            name: self.name.clone(),
            why: format!("cannot read {} ({io})", path.display()),
        })?;
        let identity = text.trim().to_owned();
        if !is_image_identity(&identity) {
            return Err(ResolveImageError::Broken {
                name: self.name.clone(),
                why: format!("{} does not hold a sha256:<hex> identity", path.display()),
            });
        }
        Ok(identity)
    }
}

/// One image of the store, read now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredImage {
    /// Its name and directory.
    pub at: ImageDir,
    /// `sha256:` over its manifest.
    pub identity: String,
    /// The interpreters found in it: `/usr/bin/python3` (python), `/usr/bin/node`
    /// (javascript), each an executable file once its symlinks are followed inside the
    /// image.
    pub languages: Vec<Language>,
    /// Its VM disk, when it has one made from this identity.
    pub disk: Option<PathBuf>,
    /// The trial simulators it declares in its simulator index
    /// (`/opt/plimsoll/simulators/index.json`, docs/simulators.md), or why that index is
    /// unusable. An image without an index declares none.
    pub simulators: Result<Vec<SimulatorEntry>, String>,
}

impl StoredImage {
    /// Its name.
    pub fn name(&self) -> &str {
        &self.at.name
    }

    /// Its name and identity, as a record states them.
    pub fn reference(&self) -> ImageRef {
        ImageRef {
            name: self.at.name.clone(),
            identity: self.identity.clone(),
        }
    }

    /// It as `GET /v1/providers` and `plimsoll image list` list it: `store` says whether it
    /// is the default, the caller whether the VM provider can boot it.
    pub fn info(&self, store: &ImageStore, vm_disk: bool) -> ImageInfo {
        ImageInfo {
            name: self.at.name.clone(),
            identity: self.identity.clone(),
            default: self.at.name == store.default_name(),
            languages: self.languages.clone(),
            vm_disk,
            simulators: self.simulators.clone().unwrap_or_default(),
        }
    }

    /// Whether it declares every simulator `spec`'s trial steps name (with the SHA-256 a step
    /// asks for); `Err` says which it lacks and what it has.
    pub fn has_simulators(&self, spec: &plimsoll_wire::RunSpec) -> Result<(), String> {
        let plimsoll_wire::RunSpec::Project(project) = spec else {
            return Ok(());
        };
        for step in &project.steps {
            let Some(Ok(args)) = plimsoll_wire::trial_step::trial_step(step) else {
                continue;
            };
            let Some(wanted) = plimsoll_wire::trial_step::simulator_of(&args) else {
                continue;
            };
            let declared = self.simulators.as_ref().map_err(|why| {
                format!(
                    "image `{}` has an unusable simulator index, so it cannot run the trial step's simulator {}: {why}",
                    self.at.name, wanted.name
                )
            })?;
            let Some(entry) = declared.iter().find(|s| s.name == wanted.name) else {
                let have: Vec<&str> = declared.iter().map(|s| s.name.as_str()).collect();
                return Err(format!(
                    "image `{}` declares no simulator {} (it has: {}); name an image that carries it (`plimsoll image show NAME` lists its simulators)",
                    self.at.name,
                    wanted.name,
                    if have.is_empty() {
                        "none".to_owned()
                    } else {
                        have.join(", ")
                    }
                ));
            };
            if let Some(sha) = wanted.sha256
                && sha != entry.sha256
            {
                return Err(format!(
                    "the trial step asks for simulator {} with SHA-256 {sha}, but image `{}` carries {}",
                    wanted.name, self.at.name, entry.sha256
                ));
            }
        }
        Ok(())
    }

    /// Whether it can start `language`'s interpreter; `Err` says what is missing.
    pub fn starts(&self, language: Language) -> Result<(), String> {
        if self.languages.contains(&language) {
            return Ok(());
        }
        Err(format!(
            "image `{}` cannot start {}: {} is not an executable file in it; name an image \
             that has it (`plimsoll image list` says which languages each image starts)",
            self.at.name,
            language.as_str(),
            interpreter_path(language)
        ))
    }
}

/// Where an image must hold a language's interpreter (the agent starts it by this path).
pub fn interpreter_path(language: Language) -> &'static str {
    match language {
        Language::Python => "/usr/bin/python3",
        Language::Javascript => "/usr/bin/node",
    }
}

/// What [`ImageStore::list`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Listing {
    /// The images that can be used, sorted by name.
    pub images: Vec<StoredImage>,
    /// The ones that cannot: name, and why.
    pub broken: Vec<(String, String)>,
}

/// The operator's images: a directory of them and the name of the default one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageStore {
    dir: PathBuf,
    default: String,
}

/// The store's directory cannot be read.
#[derive(Debug, thiserror::Error)]
#[error("cannot read the image store {}", dir.display())]
pub struct ListImagesError {
    /// The store's directory.
    pub dir: PathBuf,
    /// Why.
    #[source]
    pub io: io::Error,
}

/// A request's image cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum ResolveImageError {
    /// No image answers to that name or identity.
    #[error(
        "no image `{asked}` here: this daemon has {}; name one of them, or build or import it (`plimsoll image build`, `plimsoll image import`)",
        list_names(have)
    )]
    Unknown {
        /// The name or identity asked for.
        asked: String,
        /// The images there are (name, identity).
        have: Vec<(String, String)>,
    },
    /// The image is in the store but cannot be used as it is.
    #[error("image `{name}` cannot be used: {why}")]
    Broken {
        /// Its name.
        name: String,
        /// What is wrong.
        why: String,
    },
    /// The store cannot be read.
    #[error(transparent)]
    List(#[from] ListImagesError),
}

fn list_names(have: &[(String, String)]) -> String {
    if have.is_empty() {
        return "no image at all".to_owned();
    }
    have.iter()
        .map(|(name, identity)| format!("{name} ({identity})"))
        .collect::<Vec<_>>()
        .join(", ")
}

impl ImageStore {
    /// A store at `dir` whose default image is `default`.
    pub fn new(dir: PathBuf, default: String) -> Self {
        ImageStore { dir, default }
    }

    /// The store's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The default image's name.
    pub fn default_name(&self) -> &str {
        &self.default
    }

    /// Where the image `name` lives (whether or not it is there).
    pub fn image_dir(&self, name: &str) -> ImageDir {
        ImageDir {
            name: name.to_owned(),
            dir: self.dir.join(name),
        }
    }

    /// The names of the store's images, sorted; entries starting with `.` and anything
    /// that is not a directory with an `identity` file are left out.
    pub fn names(&self) -> Result<Vec<String>, ListImagesError> {
        let entries = match fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(io) if io.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(io) => {
                return Err(ListImagesError {
                    dir: self.dir.clone(),
                    io,
                });
            }
        };
        let mut names = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|io| ListImagesError {
                dir: self.dir.clone(),
                io,
            })?;
            let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
                continue;
            };
            let dir = entry.path();
            let is_dir = fs::symlink_metadata(&dir).is_ok_and(|m| m.is_dir());
            if is_image_name(&name) && is_dir && dir.join("identity").is_file() {
                names.push(name);
            }
        }
        names.sort();
        Ok(names)
    }

    /// Every image of the store, sorted by name: the ones that can be read, and the ones
    /// that cannot (name, why).
    pub fn list(&self) -> Result<Listing, ListImagesError> {
        let mut listing = Listing::default();
        for name in self.names()? {
            match self.read(&name) {
                Ok(image) => listing.images.push(image),
                Err(e) => listing.broken.push((name, e.to_string())),
            }
        }
        Ok(listing)
    }

    /// The image a request names (a name or an identity), or the default one for `None`.
    /// An identity several names share resolves to the default image if it is one of them,
    /// else to the first by name.
    pub fn resolve(&self, selector: Option<&str>) -> Result<StoredImage, ResolveImageError> {
        let asked = selector.unwrap_or(&self.default);
        if is_image_name(asked) {
            if self.dir.join(asked).join("identity").is_file() {
                return self.read(asked);
            }
        } else if is_image_identity(asked) {
            let mut matching: Vec<StoredImage> = self
                .list()?
                .images
                .into_iter()
                .filter(|i| i.identity == asked)
                .collect();
            if let Some(at) = matching.iter().position(|i| i.at.name == self.default) {
                return Ok(matching.swap_remove(at));
            }
            if !matching.is_empty() {
                return Ok(matching.swap_remove(0));
            }
        }
        let have = self
            .list()?
            .images
            .into_iter()
            .map(|i| (i.at.name, i.identity))
            .collect();
        Err(ResolveImageError::Unknown {
            asked: asked.to_owned(),
            have,
        })
    }

    /// Reads one image: its identity, its languages and its disk.
    pub fn read(&self, name: &str) -> Result<StoredImage, ResolveImageError> {
        let at = self.image_dir(name);
        let identity = at.read_identity()?;
        let rootfs = at.rootfs();
        match fs::symlink_metadata(&rootfs) {
            Ok(m) if m.is_dir() => {}
            _ => {
                return Err(ResolveImageError::Broken {
                    name: name.to_owned(),
                    why: format!("{} is not a directory", rootfs.display()),
                });
            }
        }
        let languages = [Language::Python, Language::Javascript]
            .into_iter()
            .filter(|l| executable_in_root(&rootfs, interpreter_path(*l)))
            .collect();
        let disk = at.dir.join("disk.ext4");
        let disk_identity = fs::read_to_string(at.dir.join("disk.identity")).ok();
        let disk = (disk.is_file() && disk_identity.as_deref().map(str::trim) == Some(&identity))
            .then_some(disk);
        let simulators = read_simulators(&rootfs);
        Ok(StoredImage {
            at,
            identity,
            languages,
            disk,
            simulators,
        })
    }
}

/// The simulators the image at `root` declares: none without an index; `Err` for an index
/// that is unreadable, not as docs/simulators.md says, or points under a directory a
/// sandbox's code can write.
fn read_simulators(root: &Path) -> Result<Vec<SimulatorEntry>, String> {
    let Some(path) = resolve_in_root(root, IMAGE_INDEX) else {
        return Ok(Vec::new());
    };
    let meta = fs::metadata(&path).map_err(|e| format!("{IMAGE_INDEX}: {e}"))?;
    if !meta.is_file() || meta.len() > MAX_INDEX_BYTES {
        return Err(format!(
            "{IMAGE_INDEX} is not a regular file of at most {MAX_INDEX_BYTES} bytes"
        ));
    }
    let bytes = fs::read(&path).map_err(|e| format!("{IMAGE_INDEX}: {e}"))?;
    let index = SimulatorIndex::parse(&bytes).map_err(|e| format!("{IMAGE_INDEX}: {e}"))?;
    for s in &index.simulators {
        s.check_in_image()?;
    }
    Ok(index.simulators)
}

/// Whether `path` (absolute inside the image) is an executable regular file once every
/// symlink on the way is followed inside `root`, as the sandbox would see it: an absolute
/// target starts again at `root`, `..` stops at it.
pub fn executable_in_root(root: &Path, path: &str) -> bool {
    resolve_in_root(root, path).is_some_and(|p| {
        fs::metadata(&p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    })
}

/// `path` resolved inside `root` (see [`executable_in_root`]), or `None` when a component
/// is missing or the links go round more than 40 times.
pub fn resolve_in_root(root: &Path, path: &str) -> Option<PathBuf> {
    let mut pending: Vec<std::ffi::OsString> = Path::new(path)
        .components()
        .rev()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_owned()),
            Component::ParentDir => Some("..".into()),
            _ => None,
        })
        .collect();
    let mut at: Vec<std::ffi::OsString> = Vec::new();
    let mut hops = 0;
    while let Some(part) = pending.pop() {
        if part == ".." {
            at.pop();
            continue;
        }
        let mut candidate = root.to_path_buf();
        candidate.extend(&at);
        candidate.push(&part);
        let meta = fs::symlink_metadata(&candidate).ok()?;
        if meta.file_type().is_symlink() {
            hops += 1;
            if hops > 40 {
                return None;
            }
            let target = fs::read_link(&candidate).ok()?;
            if target.is_absolute() {
                at.clear();
            }
            for c in target.components().rev() {
                match c {
                    Component::Normal(n) => pending.push(n.to_owned()),
                    Component::ParentDir => pending.push("..".into()),
                    _ => {}
                }
            }
        } else {
            at.push(part);
        }
    }
    let mut out = root.to_path_buf();
    out.extend(&at);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn image(store: &Path, name: &str, identity: &str, python: bool) -> PathBuf {
        let dir = store.join(name);
        fs::create_dir_all(dir.join("rootfs/usr/bin")).unwrap();
        fs::write(dir.join("identity"), format!("{identity}\n")).unwrap();
        if python {
            let real = dir.join("rootfs/usr/bin/python3.11");
            fs::write(&real, "#!").unwrap();
            fs::set_permissions(&real, fs::Permissions::from_mode(0o755)).unwrap();
            symlink("python3.11", dir.join("rootfs/usr/bin/python3")).unwrap();
        }
        dir
    }

    fn id(byte: &str) -> String {
        format!("sha256:{}", byte.repeat(32))
    }

    fn trial(step: &str) -> plimsoll_wire::RunSpec {
        plimsoll_wire::RunSpec::Project(plimsoll_wire::Project {
            files: Vec::new(),
            steps: vec![plimsoll_wire::Step {
                name: None,
                run: step.into(),
            }],
            artifacts: Vec::new(),
        })
    }

    #[test]
    fn an_image_declares_the_simulators_its_index_lists() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = image(tmp.path(), "exam", &id("aa"), true);
        image(tmp.path(), "bare", &id("bb"), true);
        let sha = "cd".repeat(32);
        fs::create_dir_all(dir.join("rootfs/opt/plimsoll/simulators")).unwrap();
        fs::write(
            dir.join("rootfs/opt/plimsoll/simulators/index.json"),
            format!(
                r#"{{"format": "plimsoll-simulators/1", "simulators": [{{"name": "tank", "path": "/opt/plimsoll/simulators/tank.wasm", "sha256": "{sha}"}}]}}"#
            ),
        )
        .unwrap();
        let store = ImageStore::new(tmp.path().into(), "exam".into());
        let exam = store.resolve(Some("exam")).unwrap();
        assert_eq!(exam.simulators.as_ref().unwrap()[0].name, "tank");
        let ok = |s: &StoredImage, step: &str| s.has_simulators(&trial(step));
        ok(&exam, "plimsoll-trial-runner --simulator tank -- node c.js").unwrap();
        ok(
            &exam,
            &format!(
                "plimsoll-trial-runner --simulator tank --simulator-sha256 {sha} -- node c.js"
            ),
        )
        .unwrap();
        ok(&exam, "echo no trial --simulator boat").unwrap();
        let e = ok(&exam, "plimsoll-trial-runner --simulator boat -- node c.js").unwrap_err();
        assert!(
            e.contains("declares no simulator boat (it has: tank)"),
            "{e}"
        );
        let e = ok(
            &exam,
            &format!(
                "plimsoll-trial-runner --simulator tank --simulator-sha256 {} -- node c.js",
                "0".repeat(64)
            ),
        )
        .unwrap_err();
        assert!(e.contains(&format!("carries {sha}")), "{e}");
        let bare = store.resolve(Some("bare")).unwrap();
        assert_eq!(bare.simulators, Ok(Vec::new()));
        let e = ok(&bare, "plimsoll-trial-runner --simulator tank -- node c.js").unwrap_err();
        assert!(e.contains("(it has: none)"), "{e}");
        // An index that points into /work is unusable, and says so.
        fs::write(
            dir.join("rootfs/opt/plimsoll/simulators/index.json"),
            format!(
                r#"{{"format": "plimsoll-simulators/1", "simulators": [{{"name": "tank", "path": "/work/tank.wasm", "sha256": "{sha}"}}]}}"#
            ),
        )
        .unwrap();
        let exam = store.resolve(Some("exam")).unwrap();
        let e = ok(&exam, "plimsoll-trial-runner --simulator tank -- node c.js").unwrap_err();
        assert!(
            e.contains("unusable simulator index") && e.contains("/work"),
            "{e}"
        );
    }

    #[test]
    fn names_identities_and_the_default_resolve_and_nothing_else_does() {
        let tmp = tempfile::tempdir().unwrap();
        image(tmp.path(), "sandbox", &id("aa"), true);
        image(tmp.path(), "data", &id("bb"), true);
        image(tmp.path(), "copy", &id("bb"), false);
        fs::create_dir_all(tmp.path().join(".import.tmp.x")).unwrap();
        fs::create_dir_all(tmp.path().join("half-built/rootfs")).unwrap();
        let store = ImageStore::new(tmp.path().into(), "sandbox".into());
        assert_eq!(store.names().unwrap(), ["copy", "data", "sandbox"]);
        assert_eq!(store.resolve(None).unwrap().name(), "sandbox");
        assert_eq!(store.resolve(Some("data")).unwrap().identity, id("bb"));
        // An identity two names share: the first by name (no default among them).
        assert_eq!(store.resolve(Some(&id("bb"))).unwrap().name(), "copy");
        assert_eq!(store.resolve(Some(&id("aa"))).unwrap().name(), "sandbox");
        for missing in ["nope", "half-built", ".import.tmp.x", &id("cc")] {
            let e = store.resolve(Some(missing)).unwrap_err().to_string();
            assert!(
                e.contains(&format!("no image `{missing}`"))
                    && e.contains(&format!("sandbox ({})", id("aa")))
                    && e.contains("data"),
                "{e}"
            );
        }
        let copy = store.resolve(Some("copy")).unwrap();
        assert!(copy.languages.is_empty());
        assert!(
            copy.starts(Language::Python)
                .unwrap_err()
                .contains("/usr/bin/python3")
        );
        assert_eq!(
            store.resolve(Some("data")).unwrap().languages,
            [Language::Python]
        );
    }

    #[test]
    fn a_bad_identity_or_default_is_said() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = image(tmp.path(), "sandbox", "md5:xyz", true);
        let store = ImageStore::new(tmp.path().into(), "sandbox".into());
        let e = store.resolve(None).unwrap_err().to_string();
        assert!(e.contains("does not hold a sha256"), "{e}");
        fs::write(dir.join("identity"), id("aa")).unwrap();
        let other = ImageStore::new(tmp.path().into(), "gone".into());
        let e = other.resolve(None).unwrap_err().to_string();
        assert!(e.contains("no image `gone`"), "{e}");
    }

    #[test]
    fn a_disk_counts_only_when_made_from_this_identity() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = image(tmp.path(), "data", &id("bb"), true);
        let store = ImageStore::new(tmp.path().into(), "data".into());
        fs::write(dir.join("disk.ext4"), "").unwrap();
        fs::write(dir.join("disk.identity"), id("aa")).unwrap();
        assert!(store.resolve(None).unwrap().disk.is_none());
        fs::write(dir.join("disk.identity"), format!("{}\n", id("bb"))).unwrap();
        assert!(store.resolve(None).unwrap().disk.is_some());
    }

    #[test]
    fn links_are_followed_inside_the_root_only() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("root");
        fs::create_dir_all(root.join("usr/bin")).unwrap();
        fs::create_dir_all(root.join("opt/py")).unwrap();
        let real = root.join("opt/py/python");
        fs::write(&real, "#!").unwrap();
        fs::set_permissions(&real, fs::Permissions::from_mode(0o755)).unwrap();
        // absolute: inside the root, not the host's /opt
        symlink("/opt/py/python", root.join("usr/bin/python3")).unwrap();
        assert!(executable_in_root(&root, "/usr/bin/python3"));
        // `..` stops at the root: ../../../opt/py/python from usr/bin is the root's opt
        fs::remove_file(root.join("usr/bin/python3")).unwrap();
        symlink("../../../../opt/py/python", root.join("usr/bin/python3")).unwrap();
        assert!(executable_in_root(&root, "/usr/bin/python3"));
        // a link to a host path the image lacks is not followed out of the root
        fs::remove_file(root.join("usr/bin/python3")).unwrap();
        symlink("/bin/sh", root.join("usr/bin/python3")).unwrap();
        assert!(!executable_in_root(&root, "/usr/bin/python3"));
        // a loop ends
        symlink("node", root.join("usr/bin/node")).unwrap();
        assert!(!executable_in_root(&root, "/usr/bin/node"));
        // not executable
        fs::set_permissions(&real, fs::Permissions::from_mode(0o644)).unwrap();
        fs::remove_file(root.join("usr/bin/python3")).unwrap();
        symlink("/opt/py/python", root.join("usr/bin/python3")).unwrap();
        assert!(!executable_in_root(&root, "/usr/bin/python3"));
    }
}
