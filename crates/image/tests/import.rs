//! Importing images: a small valid image in all three forms, and one hostile archive per
//! way out of the store or into a sandbox (whiteouts, links out, write-through symlinks,
//! `..` and absolute names, device nodes, set-id bits, file capabilities, compression and
//! sparse bombs, a symlinked /work). Every case checks that the import is refused with the
//! right error or made safe, that a canary outside the store and an existing image are
//! unchanged, that no set-id bit or extended attribute is left in the store, and that no
//! temporary directory is. Needs root, skopeo and umoci; skips (or fails under CI=true)
//! without them.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs;
use std::io::Write as _;
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::time::Duration;

use flate2::Compression;
use flate2::write::GzEncoder;
use plimsoll_image::{
    ImageStore, ImportImageError, Imported, Language, Limits, Source, SourceForm, import,
};
use plimsoll_sandbox::{CaptureLimits, Spawn, capture};
use sha2::{Digest as _, Sha256};
use tar::{EntryType, Header};

// --- layers ----------------------------------------------------------------------------

/// A layer tar written entry by entry, names and link targets as raw bytes (so `..` and
/// absolute names go in as they are).
struct Layer(tar::Builder<Vec<u8>>);

impl Layer {
    fn new() -> Self {
        Layer(tar::Builder::new(Vec::new()))
    }

    fn header(kind: EntryType, name: &[u8], link: &[u8], mode: u32, size: u64) -> Header {
        let mut h = Header::new_gnu();
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(0);
        h.set_size(size);
        assert!(name.len() < 100 && link.len() < 100);
        let old = h.as_old_mut();
        old.name = [0; 100];
        old.name[..name.len()].copy_from_slice(name);
        old.linkname = [0; 100];
        old.linkname[..link.len()].copy_from_slice(link);
        h
    }

    fn put(mut self, mut h: Header, data: &[u8]) -> Self {
        h.set_cksum();
        self.0.append(&h, data).unwrap();
        self
    }

    fn dir(self, name: &str, mode: u32) -> Self {
        let h = Self::header(EntryType::Directory, name.as_bytes(), b"", mode, 0);
        self.put(h, b"")
    }

    fn file(self, name: &str, data: &[u8], mode: u32) -> Self {
        self.file_raw(name.as_bytes(), data, mode)
    }

    fn file_raw(self, name: &[u8], data: &[u8], mode: u32) -> Self {
        let h = Self::header(EntryType::Regular, name, b"", mode, data.len() as u64);
        self.put(h, data)
    }

    fn symlink(self, name: &str, target: &str) -> Self {
        let h = Self::header(
            EntryType::Symlink,
            name.as_bytes(),
            target.as_bytes(),
            0o777,
            0,
        );
        self.put(h, b"")
    }

    fn hardlink(self, name: &str, target: &str) -> Self {
        let h = Self::header(
            EntryType::Link,
            name.as_bytes(),
            target.as_bytes(),
            0o644,
            0,
        );
        self.put(h, b"")
    }

    fn node(self, name: &str, kind: EntryType, major: u32, minor: u32) -> Self {
        let mut h = Self::header(kind, name.as_bytes(), b"", 0o666, 0);
        h.set_device_major(major).unwrap();
        h.set_device_minor(minor).unwrap();
        self.put(h, b"")
    }

    /// A PAX extended header (`x`) for the entry that follows.
    fn pax(self, name: &str, records: &[(&str, &[u8])]) -> Self {
        let mut body = Vec::new();
        for (key, value) in records {
            // "<len> <key>=<value>\n", where <len> counts itself.
            let rest = key.len() + value.len() + 3;
            let mut len = rest + 1;
            while len != rest + len.to_string().len() {
                len = rest + len.to_string().len();
            }
            body.extend_from_slice(format!("{len} {key}=").as_bytes());
            body.extend_from_slice(value);
            body.push(b'\n');
        }
        let h = Self::header(
            EntryType::XHeader,
            format!("PaxHeaders/{name}").as_bytes(),
            b"",
            0o644,
            body.len() as u64,
        );
        self.put(h, &body)
    }

    fn tar(self) -> Vec<u8> {
        self.0.into_inner().unwrap()
    }
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut gz = GzEncoder::new(Vec::new(), Compression::fast());
    gz.write_all(bytes).unwrap();
    gz.finish().unwrap()
}

fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// A layer as it goes into a layout: its gzip blob and the digest of its tar (diff id).
struct Blob {
    gz: Vec<u8>,
    diff_id: String,
}

impl Blob {
    fn of(tar: &[u8]) -> Self {
        Blob {
            gz: gzip(tar),
            diff_id: sha256(tar),
        }
    }
}

/// Writes an OCI image layout at `dir`: one image per `(ref name, layers)`, blobs by
/// sha256, an amd64/linux config with the layers' diff ids.
fn oci_layout(dir: &Path, images: &[(&str, Vec<Blob>)]) {
    fs::create_dir_all(dir.join("blobs/sha256")).unwrap();
    let put = |bytes: &[u8]| {
        let digest = sha256(bytes);
        fs::write(dir.join("blobs/sha256").join(&digest[7..]), bytes).unwrap();
        serde_json::json!({"digest": digest, "size": bytes.len()})
    };
    let mut manifests = Vec::new();
    for (name, blobs) in images {
        let layers: Vec<serde_json::Value> = blobs
            .iter()
            .map(|b| {
                let mut d = put(&b.gz);
                d["mediaType"] = "application/vnd.oci.image.layer.v1.tar+gzip".into();
                d
            })
            .collect();
        let diff_ids: Vec<&str> = blobs.iter().map(|b| b.diff_id.as_str()).collect();
        let config = serde_json::json!({
            "architecture": "amd64", "os": "linux", "config": {},
            "rootfs": {"type": "layers", "diff_ids": diff_ids},
        });
        let mut config = put(config.to_string().as_bytes());
        config["mediaType"] = "application/vnd.oci.image.config.v1+json".into();
        let manifest = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": config,
            "layers": layers,
        });
        let mut m = put(manifest.to_string().as_bytes());
        m["mediaType"] = "application/vnd.oci.image.manifest.v1+json".into();
        m["annotations"] = serde_json::json!({"org.opencontainers.image.ref.name": name});
        manifests.push(m);
    }
    let index = serde_json::json!({"schemaVersion": 2, "manifests": manifests});
    fs::write(dir.join("index.json"), index.to_string()).unwrap();
    fs::write(dir.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
}

/// The layers of a small valid image: a python3 (a script, enough for the store to say the
/// image starts Python), a library, /etc, a symlink, the directories a sandbox needs.
fn valid_layers() -> Vec<Blob> {
    let base = Layer::new()
        .dir("usr", 0o755)
        .dir("usr/bin", 0o755)
        .file("usr/bin/python3.11", b"#!/bin/sh\necho python\n", 0o755)
        .symlink("usr/bin/python3", "python3.11")
        .dir("usr/lib", 0o755)
        .file(
            "usr/lib/lib with space.so",
            &[0x7f, b'E', b'L', b'F'],
            0o644,
        )
        .dir("etc", 0o755)
        .file("etc/hostname", b"valid\n", 0o644)
        .file("etc/passwd", b"root:x:0:0::/root:/bin/sh\n", 0o644)
        .dir("work", 0o755)
        .dir("tmp", 0o1777)
        .dir("opt", 0o755)
        .dir("opt/plimsoll", 0o755)
        .dir("opt/plimsoll/bin", 0o755)
        .tar();
    let top = Layer::new()
        .dir("etc", 0o755)
        .file("etc/motd", b"second layer\n", 0o644)
        .tar();
    vec![Blob::of(&base), Blob::of(&top)]
}

// --- the rig ---------------------------------------------------------------------------

/// A store with an image already in it, a canary directory beside it, and what both held
/// at the start.
struct Rig {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    store: ImageStore,
    canary: PathBuf,
    before: BTreeMap<PathBuf, (u32, Vec<u8>)>,
    var_lib_containers: bool,
    test: &'static str,
}

/// Every entry under `dir`: mode and contents (link text for a symlink), not following.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, (u32, Vec<u8>)> {
    let mut out = BTreeMap::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(d) = pending.pop() {
        let meta = fs::symlink_metadata(&d).unwrap();
        let content = if meta.is_dir() {
            for e in fs::read_dir(&d).unwrap() {
                pending.push(e.unwrap().path());
            }
            Vec::new()
        } else if meta.file_type().is_symlink() {
            fs::read_link(&d).unwrap().as_os_str().as_bytes().to_vec()
        } else {
            fs::read(&d).unwrap()
        };
        out.insert(d, (meta.mode(), content));
    }
    out
}

/// Every entry under `dir` and its mode, not following.
fn modes(dir: &Path) -> Vec<(PathBuf, u32)> {
    let mut out = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(d) = pending.pop() {
        let meta = fs::symlink_metadata(&d).unwrap();
        if meta.is_dir() {
            for e in fs::read_dir(&d).unwrap() {
                pending.push(e.unwrap().path());
            }
        }
        out.push((d, meta.mode()));
    }
    out
}

impl Rig {
    /// A rig, or `None` (having said SKIP, or failed under CI=true) without root, skopeo or
    /// umoci.
    fn new(test: &'static str) -> Option<Rig> {
        if !plimsoll_testing::is_root() {
            plimsoll_testing::skip_or_fail(test, "not root (umoci keeps owners only as root)");
            return None;
        }
        for tool in ["/usr/bin/skopeo", "/usr/bin/umoci"] {
            if !Path::new(tool).is_file() {
                plimsoll_testing::skip_or_fail(
                    test,
                    &format!("{tool} is missing (scripts/install-deps)"),
                );
                return None;
            }
        }
        let tmp = tempfile::Builder::new()
            .prefix("plimsoll-image-import.")
            .tempdir()
            .unwrap();
        let root = tmp.path().to_path_buf();
        let store_dir = root.join("store");
        // An image already there, which no import may touch.
        let keep = store_dir.join("keep");
        fs::create_dir_all(keep.join("rootfs/etc")).unwrap();
        fs::write(keep.join("rootfs/etc/keep"), "kept\n").unwrap();
        let manifest = plimsoll_image::manifest(&keep.join("rootfs"), &[]).unwrap();
        fs::write(keep.join("manifest"), &manifest).unwrap();
        fs::write(keep.join("identity"), plimsoll_image::identity(&manifest)).unwrap();
        let canary = root.join("canary");
        fs::create_dir_all(canary.join("etc")).unwrap();
        fs::write(canary.join("etc/passwd"), "canary\n").unwrap();
        fs::write(canary.join("file"), "canary\n").unwrap();
        let mut before = snapshot(&canary);
        before.extend(snapshot(&keep));
        Some(Rig {
            _tmp: tmp,
            root,
            store: ImageStore::new(store_dir, "keep".into()),
            canary,
            before,
            var_lib_containers: Path::new("/var/lib/containers").exists(),
            test,
        })
    }

    /// `canary` as a path inside an image (it is absolute on the host).
    fn canary_rel(&self) -> String {
        self.canary
            .to_str()
            .unwrap()
            .trim_start_matches('/')
            .to_owned()
    }

    /// A layout directory named `name` holding `images`.
    fn layout(&self, name: &str, images: &[(&str, Vec<Blob>)]) -> PathBuf {
        let dir = self.root.join("in").join(name);
        oci_layout(&dir, images);
        dir
    }

    fn import_with(
        &self,
        path: &Path,
        image: Option<&str>,
        name: &str,
        limits: &Limits,
    ) -> Result<Imported, ImportImageError> {
        let source = Source {
            path: path.to_owned(),
            image: image.map(str::to_owned),
        };
        let mut lines = Vec::new();
        let got = import(&source, name, &self.store, limits, &mut |l| {
            lines.push(l.to_owned())
        });
        eprintln!("{}: import {name}: {}", self.test, lines.join(" | "));
        got
    }

    fn import(&self, path: &Path, name: &str) -> Result<Imported, ImportImageError> {
        self.import_with(path, None, name, &Limits::default())
    }

    /// A one-image layout of `layers`, imported as `name`.
    fn import_layers(&self, name: &str, layers: Vec<Blob>) -> Result<Imported, ImportImageError> {
        let dir = self.layout(name, &[("latest", layers)]);
        self.import(&dir, name)
    }

    /// What every case must leave: the canary and the existing image as they were, no
    /// temporary directory, no set-id bit and no extended attribute anywhere in the store,
    /// and nothing written to /var/lib/containers (skopeo's cache as root).
    fn check(&self) {
        let mut now = snapshot(&self.canary);
        now.extend(snapshot(&self.store.dir().join("keep")));
        assert!(
            now == self.before,
            "the canary or the existing image changed"
        );
        let left: Vec<_> = fs::read_dir(self.store.dir())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .filter(|n| n.as_bytes().starts_with(b"."))
            .collect();
        assert!(left.is_empty(), "left in the store: {left:?}");
        for (path, mode) in modes(self.store.dir()) {
            assert_eq!(mode & 0o6000, 0, "{} has a set-id bit", path.display());
            let mut buf = vec![0u8; 65536];
            let n = rustix::fs::llistxattr(&path, &mut buf[..]).unwrap_or(0);
            assert_eq!(n, 0, "{} has extended attributes", path.display());
            let kind = mode & 0o170000;
            assert!(
                matches!(kind, 0o040000 | 0o100000 | 0o120000),
                "{} is not a file, directory or symlink ({mode:o})",
                path.display()
            );
        }
        if !self.var_lib_containers {
            assert!(
                !Path::new("/var/lib/containers").exists(),
                "skopeo wrote /var/lib/containers"
            );
        }
        let in_root: Vec<_> = fs::read_dir(&self.root)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        for name in &in_root {
            assert!(
                ["store", "canary", "in", "out"].contains(&name.to_str().unwrap()),
                "{name:?} appeared beside the store"
            );
        }
    }

    fn rootfs(&self, name: &str) -> PathBuf {
        self.store.dir().join(name).join("rootfs")
    }
}

impl Rig {
    /// `skopeo copy from to`, its cache under the rig's `out` (not /var/lib/containers).
    fn skopeo_copy(&self, from: &OsString, to: &OsString) {
        let running = Spawn::new("/usr/bin/skopeo", "/")
            .args(["--insecure-policy", "copy", "--quiet"])
            .arg(from)
            .arg(to)
            .env("XDG_DATA_HOME", self.root.join("out/skopeo-data"))
            .env("_CONTAINERS_ROOTLESS_UID", "65534")
            .spawn()
            .unwrap();
        let got = capture(
            running,
            &CaptureLimits::new(1 << 20, Duration::from_secs(300)),
        )
        .unwrap();
        assert_eq!(
            got.exit_code,
            Some(0),
            "skopeo copy {from:?} {to:?}: {}",
            String::from_utf8_lossy(&got.stderr)
        );
    }
}

fn os(parts: &[&std::ffi::OsStr]) -> OsString {
    parts.iter().copied().collect()
}

// --- valid images ----------------------------------------------------------------------

#[test]
fn a_valid_image_imports_in_all_three_forms_with_one_identity() {
    let Some(rig) = Rig::new("a_valid_image_imports_in_all_three_forms_with_one_identity") else {
        return;
    };
    let layout = rig.layout("valid", &[("latest", valid_layers())]);
    let out = rig.root.join("out");
    fs::create_dir(&out).unwrap();
    let (docker, oci) = (out.join("valid.docker.tar"), out.join("valid.oci.tar"));
    let from = os(&["oci:".as_ref(), layout.as_os_str(), ":latest".as_ref()]);
    rig.skopeo_copy(
        &from,
        &os(&[
            "docker-archive:".as_ref(),
            docker.as_os_str(),
            ":valid:latest".as_ref(),
        ]),
    );
    rig.skopeo_copy(
        &from,
        &os(&["oci-archive:".as_ref(), oci.as_os_str(), ":latest".as_ref()]),
    );

    let a = rig.import(&layout, "from-layout").unwrap();
    let b = rig.import(&docker, "from-docker").unwrap();
    let c = rig.import(&oci, "from-oci").unwrap();
    assert_eq!(a.form, SourceForm::OciLayout);
    assert_eq!(b.form, SourceForm::DockerArchive);
    assert_eq!(c.form, SourceForm::OciArchive);
    for got in [&a, &b, &c] {
        assert_eq!(got.image.identity, a.image.identity);
        assert_eq!(got.image.languages, [Language::Python]);
        assert_eq!(got.layers, 2);
        assert_eq!(
            got.neutralised,
            Default::default(),
            "nothing to change in a clean image"
        );
        assert!(got.oci_manifest.starts_with("sha256:"));
    }
    let listing = rig.store.list().unwrap();
    let names: Vec<(&str, &str)> = listing
        .images
        .iter()
        .map(|i| (i.name(), i.identity.as_str()))
        .collect();
    let id = a.image.identity.as_str();
    assert_eq!(
        names[..3],
        [("from-docker", id), ("from-layout", id), ("from-oci", id)]
    );
    assert!(listing.broken.is_empty(), "{:?}", listing.broken);

    // The identity is the manifest's digest, the manifest is the rootfs's, and the rootfs is
    // the layers': both layers there, owned by root, 0755 at the top.
    let dir = rig.store.dir().join("from-layout");
    let manifest = fs::read(dir.join("manifest")).unwrap();
    assert_eq!(plimsoll_image::identity(&manifest), id);
    assert_eq!(
        plimsoll_image::manifest(&dir.join("rootfs"), &[]).unwrap(),
        manifest
    );
    let text = String::from_utf8(manifest).unwrap();
    assert!(
        text.starts_with("# plimsoll-image-manifest/v1\ndir 0755 0:0 /\n"),
        "{text}"
    );
    assert!(
        text.contains(" /usr/lib/lib\\x20with\\x20space.so\n"),
        "{text}"
    );
    assert!(text.contains("dir 1777 0:0 /tmp\n"), "{text}");
    assert_eq!(
        fs::read_to_string(rig.rootfs("from-oci").join("etc/motd")).unwrap(),
        "second layer\n"
    );
    let source = fs::read_to_string(rig.store.dir().join("from-docker/source")).unwrap();
    assert!(source.starts_with("form docker-archive\npath "), "{source}");
    assert!(
        source.contains(&format!("manifest {}\n", b.oci_manifest)),
        "{source}"
    );

    // A name that is taken, and one that is not a name, are refused before anything runs.
    let e = rig.import(&layout, "from-oci").unwrap_err();
    assert!(matches!(e, ImportImageError::Exists { .. }), "{e}");
    assert!(e.to_string().contains("remove it first"), "{e}");
    let e = rig.import(&layout, "../escape").unwrap_err();
    assert!(matches!(e, ImportImageError::Name { .. }), "{e}");
    assert_eq!(rig.store.list().unwrap().images.len(), 4);
    rig.check();
}

#[test]
fn an_archive_of_several_images_needs_one_chosen() {
    let Some(rig) = Rig::new("an_archive_of_several_images_needs_one_chosen") else {
        return;
    };
    let other = vec![Blob::of(
        &Layer::new().file("other", b"other\n", 0o644).tar(),
    )];
    let layout = rig.layout("two", &[("first", valid_layers()), ("second", other)]);
    let e = rig.import(&layout, "two").unwrap_err();
    match &e {
        ImportImageError::SeveralImages { images, .. } => assert_eq!(images, &["first", "second"]),
        other => panic!("{other}"),
    }
    assert!(e.to_string().contains("choose"), "{e}");
    let e = rig
        .import_with(&layout, Some("third"), "two", &Limits::default())
        .unwrap_err();
    assert!(matches!(e, ImportImageError::NoSuchImage { .. }), "{e}");
    let got = rig
        .import_with(&layout, Some("second"), "two", &Limits::default())
        .unwrap();
    assert!(rig.rootfs("two").join("other").is_file());
    assert!(!rig.rootfs("two").join("etc").exists());
    // What a sandbox needs was made.
    for (dir, mode) in [
        ("work", 0o755),
        ("tmp", 0o1777),
        ("opt/plimsoll/bin", 0o755),
    ] {
        let meta = fs::symlink_metadata(rig.rootfs("two").join(dir)).unwrap();
        assert!(meta.is_dir() && meta.uid() == 0 && meta.gid() == 0, "{dir}");
        assert_eq!(meta.mode() & 0o7777, mode, "{dir}");
    }
    assert!(
        got.neutralised
            .made
            .contains(&"/opt/plimsoll/bin".to_owned())
    );
    assert!(got.image.languages.is_empty());

    // A compressed archive and a directory that is no layout are said to be what they are.
    let gz = rig.root.join("in/two.tar.gz");
    fs::write(&gz, gzip(b"not really a tar")).unwrap();
    let e = rig.import(&gz, "gz").unwrap_err();
    assert!(e.to_string().contains("gunzip"), "{e}");
    let e = rig.import(&rig.root.join("in"), "dir").unwrap_err();
    assert!(matches!(e, ImportImageError::NotAnImage { .. }), "{e}");
    rig.check();
}

#[test]
fn an_archive_made_from_a_rootfs_imports_to_the_same_manifest() {
    let Some(rig) = Rig::new("an_archive_made_from_a_rootfs_imports_to_the_same_manifest") else {
        return;
    };
    let tree = rig.root.join("in/tree");
    for d in ["work", "tmp", "opt/plimsoll/bin", "usr/bin"] {
        fs::create_dir_all(tree.join(d)).unwrap();
    }
    fs::set_permissions(tree.join("tmp"), fs::Permissions::from_mode(0o1777)).unwrap();
    fs::set_permissions(&tree, fs::Permissions::from_mode(0o755)).unwrap();
    fs::write(tree.join("usr/bin/python3"), "#!/bin/sh\n").unwrap();
    fs::set_permissions(
        tree.join("usr/bin/python3"),
        fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    std::os::unix::fs::symlink("usr/bin", tree.join("bin")).unwrap();
    std::os::unix::fs::lchown(tree.join("usr/bin/python3"), Some(1000), Some(1000)).unwrap();
    fs::create_dir(rig.root.join("out")).unwrap();
    let archive = rig.root.join("out/tree.oci.tar");
    plimsoll_image::testing::oci_archive_from_rootfs(&tree, &archive).unwrap();
    let got = rig.import(&archive, "tree").unwrap();
    assert_eq!(
        got.image.identity,
        plimsoll_image::identity(&plimsoll_image::manifest(&tree, &[]).unwrap())
    );
    assert_eq!(got.image.languages, [Language::Python]);
    rig.check();
}

#[test]
fn the_built_sandbox_image_round_trips_through_an_oci_archive() {
    let test = "the_built_sandbox_image_round_trips_through_an_oci_archive";
    let built = plimsoll_testing::workspace_root().join("build/images/sandbox");
    if !built.join("rootfs").is_dir() {
        plimsoll_testing::skip_or_fail(
            test,
            "no build/images/sandbox/rootfs (scripts/build-image)",
        );
        return;
    }
    let Some(rig) = Rig::new(test) else {
        return;
    };
    fs::create_dir(rig.root.join("out")).unwrap();
    let archive = rig.root.join("out/sandbox.oci.tar");
    plimsoll_image::testing::oci_archive_from_rootfs(&built.join("rootfs"), &archive).unwrap();
    let got = rig.import(&archive, "sandbox").unwrap();
    assert_eq!(
        got.image.languages,
        [Language::Python, Language::Javascript]
    );
    assert_eq!(got.neutralised, Default::default());
    // The same entries as the build's manifest (which has headers of its own).
    let entries = |bytes: Vec<u8>| {
        String::from_utf8(bytes)
            .unwrap()
            .lines()
            .filter(|l| !l.starts_with("# "))
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    let ours = entries(fs::read(rig.store.dir().join("sandbox/manifest")).unwrap());
    let theirs = entries(plimsoll_image::manifest(&built.join("rootfs"), &[]).unwrap());
    assert!(
        ours == theirs,
        "the imported image differs from the built one"
    );
    rig.check();
}

// --- hostile archives ------------------------------------------------------------------

#[test]
fn whiteouts_remove_lower_files_and_opaque_ones_whole_directories() {
    let Some(rig) = Rig::new("whiteouts_remove_lower_files_and_opaque_ones_whole_directories")
    else {
        return;
    };
    let lower = Layer::new()
        .dir("a", 0o755)
        .file("a/gone", b"1", 0o644)
        .file("a/kept", b"1", 0o644)
        .dir("b", 0o755)
        .file("b/hidden", b"1", 0o644)
        .dir("b/sub", 0o755)
        .file("b/sub/deep", b"1", 0o644)
        .tar();
    let upper = Layer::new()
        .file("a/.wh.gone", b"", 0o644)
        .dir("b", 0o755)
        .file("b/.wh..wh..opq", b"", 0o644)
        .file("b/new", b"2", 0o644)
        .tar();
    rig.import_layers("wh", vec![Blob::of(&lower), Blob::of(&upper)])
        .unwrap();
    let root = rig.rootfs("wh");
    assert!(!root.join("a/gone").exists());
    assert!(root.join("a/kept").is_file());
    let b: Vec<_> = fs::read_dir(root.join("b"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(b, ["new"]);
    let manifest = fs::read_to_string(rig.store.dir().join("wh/manifest")).unwrap();
    assert!(!manifest.contains(".wh."), "{manifest}");
    rig.check();
}

#[test]
fn a_hard_link_out_of_the_image_is_refused_or_stays_inside() {
    let Some(rig) = Rig::new("a_hard_link_out_of_the_image_is_refused_or_stays_inside") else {
        return;
    };
    let canary = rig.canary_rel();
    // To a host file the image lacks: umoci refuses, and says which entry.
    for target in [
        format!("../../../../../../{canary}/file"),
        format!("/{canary}/file"),
    ] {
        let layer = Layer::new()
            .dir("etc", 0o755)
            .hardlink("etc/h", &target)
            .tar();
        let e = rig
            .import_layers("hard", vec![Blob::of(&layer)])
            .unwrap_err();
        let text = e.to_string();
        assert!(
            matches!(e, ImportImageError::ToolFailed { tool: "umoci", .. }),
            "{text}"
        );
        assert!(text.contains("etc/h") && text.contains("link"), "{text}");
        fs::remove_dir_all(rig.root.join("in/hard")).unwrap();
    }
    // To a path the image has too: the link is to the image's own file.
    let layer = Layer::new()
        .dir("etc", 0o755)
        .file("etc/passwd", b"image\n", 0o644)
        .hardlink("etc/h1", "../../../../../../etc/passwd")
        .hardlink("etc/h2", &format!("/{canary}/../../../etc/passwd"))
        .tar();
    rig.import_layers("hard", vec![Blob::of(&layer)]).unwrap();
    for h in ["etc/h1", "etc/h2"] {
        assert_eq!(
            fs::read_to_string(rig.rootfs("hard").join(h)).unwrap(),
            "image\n"
        );
    }
    rig.check();
}

#[test]
fn a_symlink_to_the_host_is_not_written_through() {
    let Some(rig) = Rig::new("a_symlink_to_the_host_is_not_written_through") else {
        return;
    };
    let canary = rig.canary_rel();
    // `evil -> /` then `evil/<canary>/pwned`; `evil2 -> ../../..` then the same; a link
    // straight at the canary, then a file through it.
    let lower = Layer::new()
        .symlink("evil", "/")
        .symlink("evil2", "../../../../../../../..")
        .symlink("evil3", &format!("/{canary}"))
        .tar();
    let upper = Layer::new()
        .file("evil/etc/pwned", b"pwned\n", 0o644)
        .file(&format!("evil/{canary}/pwned"), b"pwned\n", 0o644)
        .file(&format!("evil2/{canary}/pwned2"), b"pwned\n", 0o644)
        .file("evil3/pwned3", b"pwned\n", 0o644)
        .file("evil3/file", b"overwritten\n", 0o644)
        .tar();
    let host_pwned = Path::new("/etc/pwned").exists();
    rig.import_layers("sym", vec![Blob::of(&lower), Blob::of(&upper)])
        .unwrap();
    // umoci resolves every path inside the root: the files land in the image.
    let root = rig.rootfs("sym");
    assert_eq!(fs::read_link(root.join("evil")).unwrap(), Path::new("/"));
    assert!(root.join("etc/pwned").is_file());
    assert!(root.join(&canary).join("pwned").is_file());
    assert!(root.join(&canary).join("pwned2").is_file());
    assert_eq!(
        fs::read_to_string(root.join(&canary).join("file")).unwrap(),
        "overwritten\n"
    );
    assert!(!rig.canary.join("pwned").exists() && !rig.canary.join("pwned3").exists());
    assert_eq!(
        Path::new("/etc/pwned").exists(),
        host_pwned,
        "/etc/pwned on the host"
    );
    rig.check();
}

#[test]
fn dot_dot_and_absolute_member_names_stay_inside() {
    let Some(rig) = Rig::new("dot_dot_and_absolute_member_names_stay_inside") else {
        return;
    };
    let canary = rig.canary_rel();
    let layer = Layer::new()
        .file(
            &format!("../../../../../../../{canary}/dotdot"),
            b"x",
            0o644,
        )
        .file(&format!("/{canary}/absolute"), b"x", 0o644)
        .file_raw(
            format!("a/../../../../{canary}/file").as_bytes(),
            b"overwritten\n",
            0o644,
        )
        .tar();
    rig.import_layers("names", vec![Blob::of(&layer)]).unwrap();
    let inside = rig.rootfs("names").join(&canary);
    assert!(inside.join("dotdot").is_file() && inside.join("absolute").is_file());
    assert_eq!(
        fs::read_to_string(inside.join("file")).unwrap(),
        "overwritten\n"
    );
    rig.check();
}

#[test]
fn device_nodes_and_fifos_are_removed_and_said() {
    let Some(rig) = Rig::new("device_nodes_and_fifos_are_removed_and_said") else {
        return;
    };
    let layer = Layer::new()
        .dir("dev", 0o755)
        .node("dev/mem", EntryType::Char, 1, 1)
        .node("dev/sda", EntryType::Block, 8, 0)
        .node("dev/fifo", EntryType::Fifo, 0, 0)
        .file("dev/plain", b"x", 0o644)
        .tar();
    let got = rig.import_layers("dev", vec![Blob::of(&layer)]).unwrap();
    let mut removed = got.neutralised.removed.clone();
    removed.sort();
    assert_eq!(
        removed,
        [
            ("/dev/fifo".to_owned(), "fifo"),
            ("/dev/mem".to_owned(), "character device"),
            ("/dev/sda".to_owned(), "block device"),
        ]
    );
    let left: Vec<_> = fs::read_dir(rig.rootfs("dev").join("dev"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, ["plain"]);
    let source = fs::read_to_string(rig.store.dir().join("dev/source")).unwrap();
    assert!(
        source.contains("removed character-device /dev/mem\n"),
        "{source}"
    );
    rig.check();
}

#[test]
fn set_id_bits_are_cleared_and_said() {
    let Some(rig) = Rig::new("set_id_bits_are_cleared_and_said") else {
        return;
    };
    let layer = Layer::new()
        .dir("bin", 0o2755)
        .file("bin/su", b"#!/bin/sh\n", 0o4755)
        .file("bin/wall", b"#!/bin/sh\n", 0o2755)
        .file("bin/both", b"#!/bin/sh\n", 0o6711)
        .tar();
    let got = rig.import_layers("setid", vec![Blob::of(&layer)]).unwrap();
    let mut cleared = got.neutralised.cleared_setid.clone();
    cleared.sort();
    assert_eq!(
        cleared,
        [
            ("/bin".to_owned(), 0o2755),
            ("/bin/both".to_owned(), 0o6711),
            ("/bin/su".to_owned(), 0o4755),
            ("/bin/wall".to_owned(), 0o2755),
        ]
    );
    let mode = |p: &str| fs::metadata(rig.rootfs("setid").join(p)).unwrap().mode() & 0o7777;
    assert_eq!(
        (mode("bin/su"), mode("bin/wall"), mode("bin/both")),
        (0o755, 0o755, 0o711)
    );
    rig.check();
}

#[test]
fn file_capabilities_and_other_xattrs_are_removed_and_said() {
    let Some(rig) = Rig::new("file_capabilities_and_other_xattrs_are_removed_and_said") else {
        return;
    };
    // cap_net_raw+ep, as a vfs_cap_data v2.
    let cap: &[u8] = &[
        1, 0, 0, 2, 0, 0x20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    ];
    let layer = Layer::new()
        .dir("bin", 0o755)
        .pax(
            "ping",
            &[
                ("SCHILY.xattr.security.capability", cap),
                ("SCHILY.xattr.user.note", b"x"),
            ],
        )
        .file("bin/ping", b"#!/bin/sh\n", 0o755)
        .tar();
    let got = rig.import_layers("caps", vec![Blob::of(&layer)]).unwrap();
    let mut removed = got.neutralised.removed_xattrs.clone();
    removed.sort();
    assert_eq!(
        removed,
        [
            ("/bin/ping".to_owned(), "security.capability".to_owned()),
            ("/bin/ping".to_owned(), "user.note".to_owned()),
        ]
    );
    let source = fs::read_to_string(rig.store.dir().join("caps/source")).unwrap();
    assert!(
        source.contains("removed-xattr security.capability /bin/ping\n"),
        "{source}"
    );
    rig.check();
}

#[test]
fn a_compression_bomb_is_refused_before_it_is_unpacked() {
    let Some(rig) = Rig::new("a_compression_bomb_is_refused_before_it_is_unpacked") else {
        return;
    };
    // 2 GiB of zeros in one file, as concatenated gzip members (one 1 MiB member repeated),
    // so the test need not compress 2 GiB; about 2 MB on disk.
    const SIZE: u64 = 2 << 30;
    let mut header = Layer::header(EntryType::Regular, b"zeros", b"", 0o644, SIZE);
    header.set_cksum();
    let mib = vec![0u8; 1 << 20];
    let member = gzip(&mib);
    let mut gz = gzip(header.as_bytes());
    let mut diff = Sha256::new();
    diff.update(header.as_bytes());
    for _ in 0..(SIZE >> 20) {
        gz.extend_from_slice(&member);
        diff.update(&mib);
    }
    gz.extend_from_slice(&gzip(&[0u8; 1024]));
    diff.update([0u8; 1024]);
    let blob = Blob {
        gz,
        diff_id: format!("sha256:{}", hex::encode(diff.finalize())),
    };
    let dir = rig.layout("bomb", &[("latest", vec![blob])]);
    let limits = Limits {
        unpacked_bytes: 16 << 20,
        ..Limits::default()
    };
    let e = rig.import_with(&dir, None, "bomb", &limits).unwrap_err();
    assert!(
        matches!(e, ImportImageError::UnpackedTooLarge { limit, .. } if limit == 16 << 20),
        "{e}"
    );
    assert!(e.to_string().contains("refused before unpacking"), "{e}");
    rig.check();
}

#[test]
fn a_sparse_bomb_and_too_many_entries_are_refused_before_unpacking() {
    let Some(rig) = Rig::new("a_sparse_bomb_and_too_many_entries_are_refused_before_unpacking")
    else {
        return;
    };
    // An old-GNU sparse file of 2 GiB with 512 bytes of data: a tiny stream that Go's tar
    // reader (umoci's) would write out as 2 GiB.
    const REAL: u64 = 2 << 30;
    let mut header = Layer::header(EntryType::GNUSparse, b"sparse", b"", 0o644, 512);
    let gnu = header.as_gnu_mut().unwrap();
    gnu.set_real_size(REAL);
    gnu.sparse[0].set_offset(REAL - 512);
    gnu.sparse[0].set_length(512);
    let layer = Layer::new().put(header, &[1u8; 512]).tar();
    let dir = rig.layout("sparse", &[("latest", vec![Blob::of(&layer)])]);
    let limits = Limits {
        unpacked_bytes: 64 << 20,
        ..Limits::default()
    };
    let e = rig.import_with(&dir, None, "sparse", &limits).unwrap_err();
    assert!(
        matches!(e, ImportImageError::UnpackedTooLarge { .. }),
        "{e}"
    );

    let mut many = Layer::new();
    for i in 0..100 {
        many = many.file(&format!("f{i}"), b"", 0o644);
    }
    let dir = rig.layout("many", &[("latest", vec![Blob::of(&many.tar())])]);
    let limits = Limits {
        entries: 50,
        ..Limits::default()
    };
    let e = rig.import_with(&dir, None, "many", &limits).unwrap_err();
    assert!(
        matches!(e, ImportImageError::TooManyEntries { limit: 50, .. }),
        "{e}"
    );
    // And an archive over the archive limit is refused before it is copied.
    let limits = Limits {
        archive_bytes: 100,
        ..Limits::default()
    };
    let e = rig.import_with(&dir, None, "many", &limits).unwrap_err();
    assert!(matches!(e, ImportImageError::ArchiveTooLarge { .. }), "{e}");
    rig.check();
}

#[test]
fn a_symlinked_or_missing_sandbox_directory_is_refused_or_made() {
    let Some(rig) = Rig::new("a_symlinked_or_missing_sandbox_directory_is_refused_or_made") else {
        return;
    };
    let canary = rig.canary_rel();
    let cases: [(&str, Layer, &str); 4] = [
        ("work-link", Layer::new().symlink("work", "/"), "/work"),
        (
            "work-up",
            Layer::new().symlink("work", &format!("../../../../{canary}")),
            "/work",
        ),
        ("opt-link", Layer::new().symlink("opt", "/etc"), "/opt"),
        (
            "tmp-file",
            Layer::new().file("tmp", b"not a dir", 0o644),
            "/tmp",
        ),
    ];
    for (name, layer, path) in cases {
        let e = rig
            .import_layers(name, vec![Blob::of(&layer.tar())])
            .unwrap_err();
        match &e {
            ImportImageError::Reserved { path: p, .. } => assert_eq!(p, path, "{name}: {e}"),
            other => panic!("{name}: {other}"),
        }
        assert!(!rig.store.dir().join(name).exists());
    }
    // The root itself as a symlink: umoci refuses, and says so.
    let layer = Layer::new().symlink(".", "/").tar();
    let e = rig
        .import_layers("root-link", vec![Blob::of(&layer)])
        .unwrap_err();
    assert!(
        matches!(e, ImportImageError::ToolFailed { tool: "umoci", .. }),
        "{e}"
    );
    assert!(
        e.to_string()
            .contains("refusing to change type of root directory"),
        "{e}"
    );
    // A /tmp that is a directory of the wrong mode is made 1777, root's.
    let layer = Layer::new().dir("tmp", 0o700).tar();
    let got = rig
        .import_layers("tmp-mode", vec![Blob::of(&layer)])
        .unwrap();
    let meta = fs::symlink_metadata(rig.rootfs("tmp-mode").join("tmp")).unwrap();
    assert_eq!(meta.mode() & 0o7777, 0o1777);
    assert!(
        got.neutralised
            .made
            .iter()
            .any(|m| m.starts_with("/tmp (mode 1777"))
    );
    rig.check();
}
