//! Files under the work directory, reached one path component at a time from an open
//! directory and never through a symbolic link: a project's files, its artifacts, and the
//! snippet's source file (outside the work directory).

use std::fs::File;
use std::io::{self, Read as _, Write as _};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use plimsoll_wire::{Artifact, Bytes};
use rustix::fs::{
    AtFlags, FileType, Mode, OFlags, Stat, fchmod, fstat, mkdirat, open, openat, statat,
};
use rustix::io::Errno;

/// The longest path accepted, as the host's own check.
const MAX_PATH_BYTES: usize = 4096;

/// A path that is not a plain relative path under the work directory.
#[derive(Debug, thiserror::Error)]
#[error(
    "path `{path}` must be relative to the work directory, `/`-separated, with no empty, `.` or `..` segment, no NUL or backslash, at most 4096 bytes"
)]
pub struct BadPath {
    /// The path, escaped for display.
    pub path: String,
}

/// Splits a project path into its segments, refusing anything that could leave the work
/// directory or mean two things (the same rule as the host's check).
pub fn segments(path: &str) -> Result<Vec<&str>, BadPath> {
    let bad = path.is_empty()
        || path.len() > MAX_PATH_BYTES
        || path.starts_with('/')
        || path.contains('\0')
        || path.contains('\\');
    let segs: Vec<&str> = path.split('/').collect();
    if bad || segs.iter().any(|s| s.is_empty() || *s == "." || *s == "..") {
        return Err(BadPath {
            path: path.escape_debug().to_string(),
        });
    }
    Ok(segs)
}

/// The work directory could not be used; nothing was written.
#[derive(Debug, thiserror::Error)]
pub enum OpenWorkDirError {
    /// It does not exist or is not a directory.
    #[error("cannot open the work directory {path}: create it before starting the agent")]
    Open {
        /// The directory.
        path: String,
        /// Why.
        #[source]
        source: Errno,
    },
    /// The agent's uid cannot create files in it.
    #[error(
        "the work directory {path} is not writable by this uid: give the sandbox's uid a writable work directory"
    )]
    NotWritable {
        /// The directory.
        path: String,
        /// Why.
        #[source]
        source: Errno,
    },
}

/// A project file could not be written. The job is refused.
#[derive(Debug, thiserror::Error)]
pub enum WriteFileError {
    /// The path is not a plain relative path.
    #[error(transparent)]
    BadPath(#[from] BadPath),
    /// A component on the way is a symbolic link; the agent never follows one.
    #[error(
        "cannot write `{path}`: `{component}` is a symbolic link, which the agent does not follow"
    )]
    Symlink {
        /// The file asked for.
        path: String,
        /// The leading part of it that is a link.
        component: String,
    },
    /// A directory on the way could not be created or opened.
    #[error("cannot write `{path}`: cannot create or open the directory `{component}`")]
    Dir {
        /// The file asked for.
        path: String,
        /// The leading part of it that failed.
        component: String,
        /// Why.
        #[source]
        source: Errno,
    },
    /// The file could not be created.
    #[error("cannot create `{path}`")]
    Create {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: Errno,
    },
    /// Something other than a regular file is already there.
    #[error("cannot write `{path}`: something other than a regular file is already there")]
    NotRegular {
        /// The file.
        path: String,
    },
    /// Writing the content or setting the mode failed.
    #[error("cannot write `{path}`")]
    Write {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: io::Error,
    },
}

/// The work directory, held open: every file operation starts from this descriptor.
#[derive(Debug)]
pub struct WorkDir {
    fd: OwnedFd,
}

/// Flags for each intermediate directory: a handle that needs no read permission, refused
/// when the component is a link (O_NOFOLLOW) or not a directory.
fn dir_flags() -> OFlags {
    OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC
}

fn is_symlink(dir: BorrowedFd<'_>, name: &str) -> bool {
    statat(dir, name, AtFlags::SYMLINK_NOFOLLOW).is_ok_and(|st| file_type(&st) == FileType::Symlink)
}

fn file_type(st: &Stat) -> FileType {
    FileType::from_raw_mode(st.st_mode)
}

impl WorkDir {
    /// Opens the work directory and checks the agent may create files in it. The path itself
    /// comes from the host and may be (or pass through) a link; nothing below it may.
    pub fn open(path: &str) -> Result<Self, OpenWorkDirError> {
        let fd = open(
            path,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|source| OpenWorkDirError::Open {
            path: path.to_owned(),
            source,
        })?;
        // Checked with the effective ids: a trial job's agent has real uid 0 but works as
        // the run's uid.
        rustix::fs::accessat(
            rustix::fs::CWD,
            path,
            rustix::fs::Access::WRITE_OK | rustix::fs::Access::EXEC_OK,
            AtFlags::EACCESS,
        )
        .map_err(|source| OpenWorkDirError::NotWritable {
            path: path.to_owned(),
            source,
        })?;
        Ok(WorkDir { fd })
    }

    /// Writes one project file: parent directories created (0755, less the umask), the file
    /// created or truncated with exactly `content` and mode 0755 or 0644. No component may be
    /// a symbolic link.
    pub fn write_file(
        &self,
        path: &str,
        content: &[u8],
        executable: bool,
        private: bool,
    ) -> Result<(), WriteFileError> {
        let segs = segments(path)?;
        let (name, dirs) = segs.split_last().ok_or_else(|| BadPath {
            path: path.escape_debug().to_string(),
        })?;
        let mut held: Option<OwnedFd> = None;
        for (i, dir) in dirs.iter().enumerate() {
            let parent = held.as_ref().map_or(self.fd.as_fd(), AsFd::as_fd);
            let component = || segs[..=i].join("/");
            match mkdirat(parent, *dir, Mode::from_bits_truncate(0o755)) {
                Ok(()) | Err(Errno::EXIST) => {}
                Err(source) => {
                    return Err(WriteFileError::Dir {
                        path: path.to_owned(),
                        component: component(),
                        source,
                    });
                }
            }
            match openat(parent, *dir, dir_flags(), Mode::empty()) {
                Ok(fd) => held = Some(fd),
                Err(_) if is_symlink(parent, dir) => {
                    return Err(WriteFileError::Symlink {
                        path: path.to_owned(),
                        component: component(),
                    });
                }
                Err(source) => {
                    return Err(WriteFileError::Dir {
                        path: path.to_owned(),
                        component: component(),
                        source,
                    });
                }
            }
        }
        let parent = held.as_ref().map_or(self.fd.as_fd(), AsFd::as_fd);
        // `private`: the owner's bits only (a trial's scenario, kept from its controller).
        let mode = match (executable, private) {
            (true, false) => 0o755,
            (false, false) => 0o644,
            (true, true) => 0o700,
            (false, true) => 0o600,
        };
        let mode = Mode::from_bits_truncate(mode);
        // O_NONBLOCK: opening a FIFO someone left there must not hang the agent.
        let flags = OFlags::WRONLY
            | OFlags::CREATE
            | OFlags::TRUNC
            | OFlags::NOFOLLOW
            | OFlags::NONBLOCK
            | OFlags::CLOEXEC;
        let fd = match openat(parent, *name, flags, mode) {
            Ok(fd) => fd,
            Err(_) if is_symlink(parent, name) => {
                return Err(WriteFileError::Symlink {
                    path: path.to_owned(),
                    component: path.to_owned(),
                });
            }
            Err(source) => {
                return Err(WriteFileError::Create {
                    path: path.to_owned(),
                    source,
                });
            }
        };
        let write_err = |source: io::Error| WriteFileError::Write {
            path: path.to_owned(),
            source,
        };
        let st = fstat(&fd).map_err(|e| write_err(e.into()))?;
        if file_type(&st) != FileType::RegularFile {
            return Err(WriteFileError::NotRegular {
                path: path.to_owned(),
            });
        }
        // The mode is exact, whatever the umask.
        fchmod(&fd, mode).map_err(|e| write_err(e.into()))?;
        File::from(fd).write_all(content).map_err(write_err)
    }

    /// Reads one artifact: found only when every component is a real directory or, last, a
    /// regular file (no symbolic link anywhere), and it could be opened and read. At most
    /// `cap` bytes are kept.
    pub fn read_artifact(&self, path: &str, cap: u64) -> Artifact {
        let missing = Artifact {
            path: path.to_owned(),
            found: false,
            size: 0,
            content: Bytes::default(),
            truncated: false,
        };
        match self.try_read(path, cap) {
            Some((size, content, truncated)) => Artifact {
                path: path.to_owned(),
                found: true,
                size,
                content: Bytes(content),
                truncated,
            },
            None => missing,
        }
    }

    fn try_read(&self, path: &str, cap: u64) -> Option<(u64, Vec<u8>, bool)> {
        let segs = segments(path).ok()?;
        let (name, dirs) = segs.split_last()?;
        let mut held: Option<OwnedFd> = None;
        for dir in dirs {
            let parent = held.as_ref().map_or(self.fd.as_fd(), AsFd::as_fd);
            held = Some(openat(parent, *dir, dir_flags(), Mode::empty()).ok()?);
        }
        let parent = held.as_ref().map_or(self.fd.as_fd(), AsFd::as_fd);
        let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
        let fd = openat(parent, *name, flags, Mode::empty()).ok()?;
        let st = fstat(&fd).ok()?;
        if file_type(&st) != FileType::RegularFile {
            return None;
        }
        let size = u64::try_from(st.st_size).unwrap_or(0);
        let mut file = File::from(fd);
        let mut content = Vec::with_capacity(usize::try_from(size.min(cap)).unwrap_or(0));
        (&mut file).take(cap).read_to_end(&mut content).ok()?;
        // More than the cap is there if one more byte can be read (the size on disk may be
        // stale for a file still being written).
        let mut probe = [0u8; 1];
        let truncated = size > cap || file.read(&mut probe).ok()? > 0;
        Some((size, content, truncated))
    }
}

/// The snippet's source file, in a directory of its own outside the work directory.
#[derive(Debug)]
pub struct SnippetFile {
    dir: PathBuf,
    file: PathBuf,
}

/// The snippet's file could not be written; nothing ran.
#[derive(Debug, thiserror::Error)]
#[error("cannot write the snippet to {path}: the sandbox needs a writable /tmp")]
pub struct WriteSnippetError {
    /// What failed.
    pub path: PathBuf,
    /// Why.
    #[source]
    pub source: Errno,
}

impl SnippetFile {
    /// Writes `code` to `<base>/plimsoll-snippet/<name>` (mode 0600 in a 0700 directory the
    /// agent has just created). When that directory exists already (a shared /tmp on a
    /// host), a directory named after the agent's pid is used instead, so the agent only ever
    /// writes into a directory it created. In a sandbox the fixed name keeps the path (and
    /// with it tracebacks on stderr) the same on every run.
    pub fn write(base: &Path, name: &str, code: &[u8]) -> Result<Self, WriteSnippetError> {
        Self::fill(Self::make_dir(base)?, name, code)
    }

    /// The directory [`SnippetFile::write`] writes into, made now and empty: a warm member
    /// names its file's path to the interpreter before the code is known, and writes the file
    /// into it with [`SnippetFile::write_in`].
    pub fn make_dir(base: &Path) -> Result<PathBuf, WriteSnippetError> {
        let pid = std::process::id();
        let mut candidates = vec![base.join("plimsoll-snippet")];
        candidates.extend((0..16).map(|i| base.join(format!("plimsoll-snippet-{pid}-{i}"))));
        let mut last = Errno::EXIST;
        for dir in candidates {
            match rustix::fs::mkdir(&dir, Mode::from_bits_truncate(0o700)) {
                Ok(()) => return Ok(dir),
                Err(Errno::EXIST) => last = Errno::EXIST,
                Err(source) => return Err(WriteSnippetError { path: dir, source }),
            }
        }
        Err(WriteSnippetError {
            path: base.join("plimsoll-snippet"),
            source: last,
        })
    }

    /// Writes `code` to `<dir>/<name>` (a new file, mode 0600) in a directory from
    /// [`SnippetFile::make_dir`].
    pub fn write_in(dir: PathBuf, name: &str, code: &[u8]) -> Result<Self, WriteSnippetError> {
        Self::fill(dir, name, code)
    }

    fn fill(dir: PathBuf, name: &str, code: &[u8]) -> Result<Self, WriteSnippetError> {
        let file = dir.join(name);
        let err = |source| WriteSnippetError {
            path: file.clone(),
            source,
        };
        let dfd = open(&dir, dir_flags(), Mode::empty()).map_err(err)?;
        let flags =
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = openat(&dfd, name, flags, Mode::from_bits_truncate(0o600)).map_err(err)?;
        File::from(fd).write_all(code).map_err(|e| {
            err(Errno::from_raw_os_error(
                e.raw_os_error().unwrap_or(libc::EIO),
            ))
        })?;
        Ok(SnippetFile { dir, file })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.file
    }

    /// Removes the file and its directory (best effort: the sandbox goes away anyway).
    pub fn remove(self) {
        let _ = std::fs::remove_file(&self.file);
        let _ = std::fs::remove_dir(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_relative_paths_only() {
        assert_eq!(segments("a/b.txt").unwrap(), ["a", "b.txt"]);
        assert_eq!(segments("..a/b..").unwrap(), ["..a", "b.."]);
        for bad in [
            "",
            "/etc/passwd",
            "../x",
            "a/../../x",
            "a/./b",
            "a//b",
            "a/",
            "./a",
            "a\\b",
            "a\0b",
            "..",
        ] {
            assert!(segments(bad).is_err(), "{bad:?}");
        }
        assert!(segments(&"a".repeat(4097)).is_err());
        assert!(segments(&"a".repeat(4096)).is_ok());
    }

    #[test]
    fn writes_and_reads_without_following_links() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), b"secret").unwrap();
        let wd = WorkDir::open(tmp.path().to_str().unwrap()).unwrap();
        wd.write_file("d/e/f.bin", &[0, 255, 10], true, false)
            .unwrap();
        let a = wd.read_artifact("d/e/f.bin", 2);
        assert!(a.found && a.truncated);
        assert_eq!((a.size, a.content.as_slice()), (3, &[0u8, 255][..]));
        std::os::unix::fs::symlink(outside.path(), tmp.path().join("link")).unwrap();
        let e = wd.write_file("link/x", b"x", false, false).unwrap_err();
        assert!(matches!(e, WriteFileError::Symlink { .. }), "{e:?}");
        assert!(!outside.path().join("x").exists());
        assert!(!wd.read_artifact("link/secret", 100).found);
    }
}
