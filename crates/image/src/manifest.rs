//! The image manifest (`plimsoll-image-manifest/v1`): one line per entry of a root file
//! system, byte for byte what `images/sandbox/manifest.py` writes, and the image identity
//! (`sha256:` over the manifest's bytes).
//!
//! The format, as manifest.py's docstring states it: header lines starting with `# ` (the
//! format's name first), then one line per entry, the root itself as `/`, sorted bytewise
//! by the entry's raw path:
//!
//! ```text
//! dir <mode> <uid>:<gid> <path>
//! file <mode> <uid>:<gid> <size> sha256:<hex> <path>
//! symlink <uid>:<gid> <target> <path>
//! ```
//!
//! `<mode>` is `st_mode & 07777` in four octal digits; in `<path>` and `<target>` every byte
//! outside 0x21..=0x7e, and `\`, is written `\xHH`. Anything else in the tree (a device
//! node, fifo or socket) or any extended attribute is refused.
//!
//! The tree is walked through directory descriptors (`openat` with `O_NOFOLLOW`, `fstatat`
//! with `AT_SYMLINK_NOFOLLOW`), so no symlink is ever followed, not even one swapped in
//! while the walk runs; `walk` is shared with the import's clean-up.

use std::ffi::{CStr, CString, OsStr};
use std::fs::File;
use std::io::{self, Read as _};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, CWD, Dir, FileType, Mode, OFlags, Stat};
use sha2::{Digest as _, Sha256};

/// The format's name, the first header line.
pub const FORMAT: &str = "plimsoll-image-manifest/v1";

/// The manifest of `root` could not be made.
#[derive(Debug, thiserror::Error)]
pub enum MakeManifestError {
    /// A header line would hold a newline.
    #[error("a manifest header cannot hold a newline: {header:?}")]
    Header {
        /// The header.
        header: String,
    },
    /// Part of the tree could not be read.
    #[error("cannot read {} to make its manifest", path.display())]
    Read {
        /// What could not be read.
        path: PathBuf,
        /// Why.
        #[source]
        io: io::Error,
    },
    /// The tree holds entries the format cannot list.
    #[error(
        "{} cannot have a manifest: {}; an image holds only directories, regular files and \
         symlinks, without extended attributes",
        root.display(),
        first_few(refused)
    )]
    Refused {
        /// The tree.
        root: PathBuf,
        /// Each entry refused and why (escaped path first), as manifest.py says them.
        refused: Vec<String>,
    },
}

fn first_few(items: &[String]) -> String {
    const SHOWN: usize = 5;
    let mut text = items
        .iter()
        .take(SHOWN)
        .cloned()
        .collect::<Vec<_>>()
        .join("; ");
    if items.len() > SHOWN {
        text.push_str(&format!(" and {} more", items.len() - SHOWN));
    }
    text
}

/// The manifest of the tree at `root` (which must be a directory, not a symlink to one),
/// with `headers` after the format's own header line.
pub fn manifest(root: &Path, headers: &[&str]) -> Result<Vec<u8>, MakeManifestError> {
    if let Some(header) = headers.iter().find(|h| h.contains('\n')) {
        return Err(MakeManifestError::Header {
            header: (*header).to_owned(),
        });
    }
    let mut lines: Vec<(Vec<u8>, String)> = Vec::new();
    let mut refused = Vec::new();
    let mut buf = vec![0u8; 256 << 10];
    walk(root, &mut |place, rel, stat| {
        let shown = escape(rel);
        let names = place.xattr_names()?;
        if !names.is_empty() {
            let names: Vec<String> = names
                .iter()
                .map(|n| String::from_utf8_lossy(n).into_owned())
                .collect();
            refused.push(format!("{shown}: extended attributes {}", names.join(",")));
        }
        let owner = format!("{}:{}", stat.st_uid, stat.st_gid);
        let mode = stat.st_mode & 0o7777;
        let line = match FileType::from_raw_mode(stat.st_mode) {
            FileType::Directory => format!("dir {mode:04o} {owner} {shown}"),
            FileType::RegularFile => {
                let digest = hash_file(place.open_file()?, &mut buf)?;
                format!(
                    "file {mode:04o} {owner} {} sha256:{digest} {shown}",
                    stat.st_size
                )
            }
            FileType::Symlink => {
                format!("symlink {owner} {} {shown}", escape(&place.read_link()?))
            }
            _ => {
                refused.push(format!(
                    "{shown}: not a file, directory or symlink (mode {:o})",
                    stat.st_mode
                ));
                return Ok(());
            }
        };
        lines.push((rel.to_vec(), line));
        Ok(())
    })
    .map_err(|e| MakeManifestError::Read {
        path: e.path(root),
        io: e.io,
    })?;
    if !refused.is_empty() {
        return Err(MakeManifestError::Refused {
            root: root.to_owned(),
            refused,
        });
    }
    lines.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    let mut out = String::new();
    for header in std::iter::once(FORMAT).chain(headers.iter().copied()) {
        out.push_str("# ");
        out.push_str(header);
        out.push('\n');
    }
    for (_, line) in lines {
        out.push_str(&line);
        out.push('\n');
    }
    Ok(out.into_bytes())
}

/// The identity of an image whose manifest is `manifest`: `sha256:` and the lowercase hex
/// SHA-256 of its bytes.
pub fn identity(manifest: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(manifest)))
}

/// `bytes` as the manifest writes a path or a link target: 0x21..=0x7e other than `\`
/// stand for themselves, every other byte is `\xHH`.
pub fn escape(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for &b in bytes {
        if (0x21..=0x7e).contains(&b) && b != b'\\' {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

fn hash_file(fd: OwnedFd, buf: &mut [u8]) -> io::Result<String> {
    let mut file = File::from(fd);
    let mut hasher = Sha256::new();
    loop {
        match file.read(buf) {
            Ok(0) => break,
            Ok(n) => hasher.update(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(hex::encode(hasher.finalize()))
}

/// Where an entry of a walked tree is: the root itself (its own descriptor), or a name in
/// a directory (the directory's descriptor). Every operation on it acts on the entry
/// itself, never on what a symlink names.
#[derive(Debug)]
pub(crate) enum Place<'a> {
    /// The root of the walk.
    Root(BorrowedFd<'a>),
    /// `name` in the directory `dir`.
    In(BorrowedFd<'a>, &'a CStr),
}

impl Place<'_> {
    /// A path naming the entry for the path-only system calls (the xattr ones): the
    /// directory through /proc/self/fd, then the name, whose last component the `l*` calls
    /// do not follow.
    fn proc_path(dir: BorrowedFd<'_>, name: &CStr) -> PathBuf {
        let mut p = PathBuf::from(format!("/proc/self/fd/{}", dir.as_raw_fd()));
        p.push(OsStr::from_bytes(name.to_bytes()));
        p
    }

    /// The names of its extended attributes; none where the file system has none.
    pub(crate) fn xattr_names(&self) -> io::Result<Vec<Vec<u8>>> {
        let mut buf = vec![0u8; 64 << 10];
        let listed = match self {
            Place::Root(fd) => rustix::fs::flistxattr(fd, &mut buf[..]),
            Place::In(dir, name) => {
                rustix::fs::llistxattr(Self::proc_path(*dir, name), &mut buf[..])
            }
        };
        let len = match listed {
            Ok(len) => len,
            // manifest.py counts an entry whose attributes cannot be listed as having none.
            Err(rustix::io::Errno::NOTSUP) => 0,
            Err(e) => return Err(e.into()),
        };
        Ok(buf[..len]
            .split(|b| *b == 0)
            .filter(|n| !n.is_empty())
            .map(<[u8]>::to_vec)
            .collect())
    }

    /// Removes its extended attribute `name`.
    pub(crate) fn remove_xattr(&self, name: &[u8]) -> io::Result<()> {
        let name = CString::new(name).map_err(io::Error::other)?;
        match self {
            Place::Root(fd) => rustix::fs::fremovexattr(fd, name.as_c_str())?,
            Place::In(dir, entry) => {
                rustix::fs::lremovexattr(Self::proc_path(*dir, entry), name.as_c_str())?
            }
        }
        Ok(())
    }

    /// Opens it for reading; fails on a symlink rather than follow it.
    pub(crate) fn open_file(&self) -> io::Result<OwnedFd> {
        let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NOCTTY;
        Ok(match self {
            Place::Root(fd) => rustix::fs::openat(fd, c".", flags, Mode::empty())?,
            Place::In(dir, name) => rustix::fs::openat(dir, *name, flags, Mode::empty())?,
        })
    }

    /// The text of the symlink it is.
    pub(crate) fn read_link(&self) -> io::Result<Vec<u8>> {
        match self {
            Place::Root(_) => Err(io::Error::other("the root is not a symlink")),
            Place::In(dir, name) => {
                Ok(rustix::fs::readlinkat(dir, *name, Vec::new())?.into_bytes())
            }
        }
    }
}

/// What [`walk`] calls on each entry: its place, its path relative to the root, its `lstat`.
pub(crate) type Visit<'v> = dyn FnMut(&Place<'_>, &[u8], &Stat) -> io::Result<()> + 'v;

/// A failure during [`walk`]: where (relative to the root, `/` for the root) and why.
#[derive(Debug)]
pub(crate) struct WalkError {
    /// The entry, as bytes relative to the root (`/` for the root itself).
    pub(crate) rel: Vec<u8>,
    /// Why.
    pub(crate) io: io::Error,
}

impl WalkError {
    /// The entry's path on the host.
    pub(crate) fn path(&self, root: &Path) -> PathBuf {
        let mut p = root.to_path_buf();
        let rel = self.rel.strip_prefix(b"/").unwrap_or(&self.rel);
        if !rel.is_empty() {
            p.push(OsStr::from_bytes(rel));
        }
        p
    }
}

/// The directory `name` in `dir` (or the path `name` when `dir` is the current directory),
/// opened without following a symlink.
pub(crate) fn open_dir<P: rustix::path::Arg>(dir: impl AsFd, name: P) -> io::Result<OwnedFd> {
    Ok(rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// Calls `visit` on every entry of the tree at `root`, the root first (as `/`), then each
/// directory's entries before its subdirectories' (no order otherwise). `visit` gets the
/// entry's place, its path relative to the root (`/usr/bin/env`) and its `lstat`. Nothing
/// is followed: the root must be a directory itself, and a subdirectory is entered only if
/// it was one when it was listed and still is when opened (`O_NOFOLLOW | O_DIRECTORY`).
/// `visit` may remove an entry that is not a directory.
pub(crate) fn walk(root: &Path, visit: &mut Visit<'_>) -> Result<(), WalkError> {
    let at = |rel: &[u8]| {
        let rel = rel.to_vec();
        move |io| WalkError { rel, io }
    };
    let root_fd = open_dir(CWD, root).map_err(at(b"/"))?;
    let stat = rustix::fs::fstat(&root_fd)
        .map_err(io::Error::from)
        .map_err(at(b"/"))?;
    visit(&Place::Root(root_fd.as_fd()), b"/", &stat).map_err(at(b"/"))?;
    // Each open directory with its path and the subdirectories still to enter.
    let mut stack: Vec<(OwnedFd, Vec<u8>, Vec<CString>)> = Vec::new();
    let subdirs = visit_entries(root_fd.as_fd(), b"", visit)?;
    stack.push((root_fd, Vec::new(), subdirs));
    while let Some((fd, rel, pending)) = stack.last_mut() {
        let Some(name) = pending.pop() else {
            stack.pop();
            continue;
        };
        let mut child_rel = rel.clone();
        child_rel.push(b'/');
        child_rel.extend_from_slice(name.to_bytes());
        let child = open_dir(fd.as_fd(), name.as_c_str()).map_err(at(&child_rel))?;
        let subdirs = visit_entries(child.as_fd(), &child_rel, visit)?;
        stack.push((child, child_rel, subdirs));
    }
    Ok(())
}

/// Visits the entries of the directory `dir` (at `rel`), returning its subdirectories.
fn visit_entries(
    dir: BorrowedFd<'_>,
    rel: &[u8],
    visit: &mut Visit<'_>,
) -> Result<Vec<CString>, WalkError> {
    let shown = if rel.is_empty() {
        b"/".to_vec()
    } else {
        rel.to_vec()
    };
    let err = |io: io::Error| WalkError {
        rel: shown.clone(),
        io,
    };
    let mut names = Vec::new();
    for entry in Dir::read_from(dir).map_err(io::Error::from).map_err(err)? {
        let entry = entry.map_err(io::Error::from).map_err(err)?;
        let name = entry.file_name();
        if name == c"." || name == c".." {
            continue;
        }
        names.push(name.to_owned());
    }
    let mut subdirs = Vec::new();
    for name in names {
        let mut child_rel = rel.to_vec();
        child_rel.push(b'/');
        child_rel.extend_from_slice(name.to_bytes());
        let child_err = |io: io::Error| WalkError {
            rel: child_rel.clone(),
            io,
        };
        let stat = rustix::fs::statat(dir, name.as_c_str(), AtFlags::SYMLINK_NOFOLLOW)
            .map_err(io::Error::from)
            .map_err(child_err)?;
        visit(&Place::In(dir, name.as_c_str()), &child_rel, &stat).map_err(child_err)?;
        if FileType::from_raw_mode(stat.st_mode) == FileType::Directory {
            subdirs.push(name);
        }
    }
    Ok(subdirs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::{PermissionsExt as _, symlink};

    use plimsoll_sandbox::{CaptureLimits, Spawn, capture};

    /// manifest.py's output for `root` (stdout, or its stderr as the error).
    fn python_manifest(root: &Path, headers: &[&str]) -> Result<Vec<u8>, String> {
        let script = plimsoll_testing::workspace_root().join("images/sandbox/manifest.py");
        let mut spawn = Spawn::new("/usr/bin/python3", "/").arg(&script).arg(root);
        for h in headers {
            spawn = spawn.arg("--header").arg(h);
        }
        let running = spawn.spawn().map_err(|e| e.to_string())?;
        let got = capture(
            running,
            &CaptureLimits::new(1 << 30, std::time::Duration::from_secs(600)),
        )
        .map_err(|e| e.to_string())?;
        if got.exit_code != Some(0) {
            return Err(String::from_utf8_lossy(&got.stderr).into_owned());
        }
        Ok(got.stdout)
    }

    fn python_or_skip(test: &str) -> bool {
        if !Path::new("/usr/bin/python3").exists() {
            plimsoll_testing::skip_or_fail(test, "no /usr/bin/python3 to run manifest.py");
            return false;
        }
        true
    }

    fn write(path: &Path, bytes: &[u8], mode: u32) {
        fs::write(path, bytes).unwrap();
        fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
    }

    /// A tree with odd names (spaces, backslashes, newlines, bytes that are not UTF-8),
    /// symlinks (dangling, absolute, to a directory, with odd targets), modes and owners.
    fn odd_tree(root: &Path) {
        fs::create_dir_all(root.join("usr/bin")).unwrap();
        fs::create_dir_all(root.join("a dir/with space")).unwrap();
        fs::create_dir(root.join(OsStr::from_bytes(b"caf\xe9 \xff"))).unwrap();
        write(&root.join("usr/bin/tool"), b"#!/bin/sh\necho hi\n", 0o755);
        write(&root.join("a dir/with space/f g"), b"", 0o600);
        write(
            &root.join(OsStr::from_bytes(b"caf\xe9 \xff/x\\y\nz")),
            b"\x00\x01",
            0o4711,
        );
        write(&root.join("sticky"), b"s", 0o1644);
        write(&root.join("ABC"), &vec![7u8; 300_000], 0o444);
        write(&root.join("abc"), b"lower", 0o2640);
        write(
            &root.join("a"),
            b"sorts before 'a dir' and after 'ABC'",
            0o644,
        );
        symlink("tool", root.join("usr/bin/link")).unwrap();
        symlink("/etc/passwd", root.join("abs")).unwrap();
        symlink("a dir", root.join("dirlink")).unwrap();
        symlink("../../nowhere", root.join("usr/dangling")).unwrap();
        symlink(
            OsStr::from_bytes(b"t\xe4rget with space\\"),
            root.join("oddlink"),
        )
        .unwrap();
        fs::hard_link(root.join("abc"), root.join("hard")).unwrap();
        fs::set_permissions(root.join("a dir"), fs::Permissions::from_mode(0o2775)).unwrap();
        fs::set_permissions(root, fs::Permissions::from_mode(0o755)).unwrap();
        if plimsoll_testing::is_root() {
            std::os::unix::fs::lchown(root.join("abc"), Some(1234), Some(5678)).unwrap();
            std::os::unix::fs::lchown(root.join("abs"), Some(42), Some(0)).unwrap();
            std::os::unix::fs::lchown(root.join("a dir"), Some(0), Some(99)).unwrap();
        }
    }

    #[test]
    fn the_same_bytes_as_manifest_py_on_an_odd_tree() {
        if !python_or_skip("the_same_bytes_as_manifest_py_on_an_odd_tree") {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("rootfs");
        fs::create_dir(&root).unwrap();
        odd_tree(&root);
        let ours = manifest(&root, &[]).unwrap();
        let theirs = python_manifest(&root, &[]).unwrap();
        assert_eq!(
            String::from_utf8_lossy(&ours),
            String::from_utf8_lossy(&theirs)
        );
        assert_eq!(ours, theirs);
        let text = String::from_utf8(ours.clone()).unwrap();
        assert!(
            text.starts_with("# plimsoll-image-manifest/v1\ndir 0755 "),
            "{text}"
        );
        assert!(
            text.contains(" /caf\\xe9\\x20\\xff/x\\x5cy\\x0az\n"),
            "{text}"
        );
        assert!(text.contains("symlink "), "{text}");
        assert!(
            text.contains(" t\\xe4rget\\x20with\\x20space\\x5c /oddlink\n"),
            "{text}"
        );
        // Headers, and the identity is the digest of exactly these bytes.
        let headers = ["image: test", "odd: ümlaut # and hash"];
        let ours = manifest(&root, &headers).unwrap();
        assert_eq!(ours, python_manifest(&root, &headers).unwrap());
        assert_eq!(
            identity(&ours),
            format!("sha256:{}", hex::encode(Sha256::digest(&ours)))
        );
        assert!(matches!(
            manifest(&root, &["two\nlines"]),
            Err(MakeManifestError::Header { .. })
        ));
    }

    #[test]
    fn what_the_format_refuses_both_refuse() {
        if !python_or_skip("what_the_format_refuses_both_refuse") {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("rootfs");
        fs::create_dir(&root).unwrap();
        write(&root.join("plain"), b"x", 0o644);
        rustix::fs::mknodat(
            CWD,
            root.join("fifo"),
            FileType::Fifo,
            Mode::from_raw_mode(0o644),
            0,
        )
        .unwrap();
        let e = manifest(&root, &[]).unwrap_err().to_string();
        assert!(
            e.contains("/fifo: not a file, directory or symlink (mode 10644)"),
            "{e}"
        );
        let py = python_manifest(&root, &[]).unwrap_err();
        assert!(
            py.contains("/fifo: not a file, directory or symlink (mode 10644)"),
            "{py}"
        );
        fs::remove_file(root.join("fifo")).unwrap();
        // A user xattr (tmpfs and ext4 both take them; skip the check where not).
        if rustix::fs::lsetxattr(
            root.join("plain"),
            c"user.test",
            b"v",
            rustix::fs::XattrFlags::empty(),
        )
        .is_ok()
        {
            let e = manifest(&root, &[]).unwrap_err().to_string();
            assert!(e.contains("/plain: extended attributes user.test"), "{e}");
            let py = python_manifest(&root, &[]).unwrap_err();
            assert!(py.contains("/plain: extended attributes user.test"), "{py}");
            rustix::fs::lremovexattr(root.join("plain"), c"user.test").unwrap();
        }
        assert_eq!(
            manifest(&root, &[]).unwrap(),
            python_manifest(&root, &[]).unwrap()
        );
        // A symlinked root is refused rather than followed.
        symlink(&root, tmp.path().join("link")).unwrap();
        assert!(matches!(
            manifest(&tmp.path().join("link"), &[]),
            Err(MakeManifestError::Read { .. })
        ));
    }

    #[test]
    fn the_same_bytes_as_manifest_py_on_the_built_sandbox_image() {
        let test = "the_same_bytes_as_manifest_py_on_the_built_sandbox_image";
        if !python_or_skip(test) {
            return;
        }
        let built = plimsoll_testing::workspace_root().join("build/images/sandbox");
        let root = built.join("rootfs");
        if !root.is_dir() {
            plimsoll_testing::skip_or_fail(
                test,
                "no build/images/sandbox/rootfs (scripts/build-image)",
            );
            return;
        }
        if !plimsoll_testing::is_root() {
            plimsoll_testing::skip_or_fail(test, "not root: the image's files are root's to read");
            return;
        }
        let ours = manifest(&root, &[]).unwrap();
        let theirs = python_manifest(&root, &[]).unwrap();
        assert!(ours == theirs, "the manifests differ");
        // The build's own manifest: the same entries under its headers.
        let mut built_manifest = String::new();
        File::open(built.join("manifest"))
            .unwrap()
            .read_to_string(&mut built_manifest)
            .unwrap();
        let entries = |text: &str| {
            text.lines()
                .filter(|l| !l.starts_with("# "))
                .map(str::to_owned)
                .collect::<Vec<_>>()
        };
        // Something may have written into the shared rootfs since it was built (build-image
        // rebuilds it then): the identity is compared only while the entries still match.
        if entries(&built_manifest) != entries(&String::from_utf8(ours).unwrap()) {
            eprintln!("{test}: the rootfs no longer matches its manifest; identity not compared");
            return;
        }
        let headers: Vec<&str> = built_manifest
            .lines()
            .filter_map(|l| l.strip_prefix("# "))
            .skip(1)
            .collect();
        let with_headers = manifest(&root, &headers).unwrap();
        let built_identity = fs::read_to_string(built.join("identity")).unwrap();
        assert_eq!(identity(&with_headers), built_identity.trim());
    }
}
