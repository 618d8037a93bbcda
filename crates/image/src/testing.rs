//! Test support for other crates' tests (hidden from the docs): an oci-archive made from a
//! root file system, so that a test can import an image that runs Python.
//!
//! ```no_run
//! # use std::path::Path;
//! # use plimsoll_image::{ImageStore, Limits, Source, import, testing};
//! let rootfs = Path::new("build/images/sandbox/rootfs");
//! let archive = Path::new("/tmp/test-scratch/sandbox.oci.tar");
//! testing::oci_archive_from_rootfs(rootfs, archive).unwrap();
//! let store = ImageStore::new("/tmp/test-scratch/images".into(), "sandbox".into());
//! let source = Source { path: archive.into(), image: None };
//! let imported = import(&source, "python", &store, &Limits::default(), &mut |l| eprintln!("{l}")).unwrap();
//! ```
//!
//! By hand, the same is: `umoci init --layout L; umoci new --image L:rootfs;
//! umoci insert --image L:rootfs <rootfs> /; skopeo copy oci:L:rootfs oci-archive:<out>`.

use std::fs;
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::DirBuilderExt as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use plimsoll_sandbox::{CaptureLimits, Spawn, capture};

/// The archive could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveFromRootfsError {
    /// Paths skopeo cannot take, or a missing tool.
    #[error("cannot make an oci-archive at {}: {why}", out.display())]
    Unusable {
        /// The archive asked for.
        out: PathBuf,
        /// Why.
        why: String,
    },
    /// A step failed.
    #[error("`{step}` failed: {said}")]
    Step {
        /// The command.
        step: String,
        /// What it printed, or why it could not run.
        said: String,
    },
    /// The scratch directory could not be made or removed.
    #[error("cannot use the scratch directory {}", dir.display())]
    Scratch {
        /// The directory.
        dir: PathBuf,
        /// Why.
        #[source]
        io: std::io::Error,
    },
}

/// Writes `out_tar`: a one-layer oci-archive (tag `rootfs`) of everything in `rootfs`,
/// owners and modes kept (run as root to keep them all), made by umoci and skopeo in a
/// scratch directory beside `out_tar`, removed afterwards. Takes about as long as gzip over
/// the tree (tens of seconds for the built sandbox image).
pub fn oci_archive_from_rootfs(
    rootfs: &Path,
    out_tar: &Path,
) -> Result<(), ArchiveFromRootfsError> {
    let unusable = |why: &str| ArchiveFromRootfsError::Unusable {
        out: out_tar.to_owned(),
        why: why.to_owned(),
    };
    let out_tar = std::path::absolute(out_tar).map_err(|e| unusable(&e.to_string()))?;
    if out_tar.as_os_str().as_bytes().contains(&b':') {
        return Err(unusable("skopeo cannot take a path with a `:`"));
    }
    let rootfs = fs::canonicalize(rootfs).map_err(|e| unusable(&format!("rootfs: {e}")))?;
    let tool = |name: &str| {
        let p = Path::new("/usr/bin").join(name);
        p.is_file().then_some(p).ok_or_else(|| {
            unusable(&format!(
                "/usr/bin/{name} is missing (scripts/install-deps)"
            ))
        })
    };
    let (umoci, skopeo) = (tool("umoci")?, tool("skopeo")?);
    let parent = out_tar
        .parent()
        .ok_or_else(|| unusable("it has no parent directory"))?;
    let scratch = parent.join(format!(
        ".oci-from-rootfs.{}.{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    ));
    fs::DirBuilder::new()
        .mode(0o700)
        .create(&scratch)
        .map_err(|io| ArchiveFromRootfsError::Scratch {
            dir: scratch.clone(),
            io,
        })?;
    let result = (|| {
        let run = |program: &Path, args: &[&std::ffi::OsStr]| {
            let step = format!(
                "{} {}",
                program.display(),
                args.iter()
                    .map(|a| a.to_string_lossy())
                    .collect::<Vec<_>>()
                    .join(" ")
            );
            let mut spawn = Spawn::new(program, &scratch).args(args);
            if program == skopeo {
                // Its blob-info cache in the scratch directory, not /var/lib/containers
                // (see the import module).
                spawn = spawn
                    .env("XDG_DATA_HOME", scratch.join("skopeo-data"))
                    .env("_CONTAINERS_ROOTLESS_UID", "65534");
            }
            let failed = |said: String| ArchiveFromRootfsError::Step {
                step: step.clone(),
                said,
            };
            let running = spawn.spawn().map_err(|e| failed(e.to_string()))?;
            let got = capture(
                running,
                &CaptureLimits::new(64 << 10, Duration::from_secs(1800)),
            )
            .map_err(|e| failed(e.to_string()))?;
            if got.exit_code != Some(0) {
                return Err(failed(
                    String::from_utf8_lossy(&got.stderr).trim().to_owned(),
                ));
            }
            Ok(())
        };
        let os = |s: &'static str| std::ffi::OsStr::new(s);
        run(&umoci, &[os("init"), os("--layout"), os("layout")])?;
        run(&umoci, &[os("new"), os("--image"), os("layout:rootfs")])?;
        run(
            &umoci,
            &[
                os("insert"),
                os("--image"),
                os("layout:rootfs"),
                rootfs.as_os_str(),
                os("/"),
            ],
        )?;
        let mut dest = std::ffi::OsString::from("oci-archive:");
        dest.push(&out_tar);
        dest.push(":rootfs");
        run(
            &skopeo,
            &[
                os("--insecure-policy"),
                os("--tmpdir"),
                scratch.as_os_str(),
                os("copy"),
                os("--quiet"),
                os("oci:layout:rootfs"),
                &dest,
            ],
        )
    })();
    let cleanup = fs::remove_dir_all(&scratch);
    result?;
    cleanup.map_err(|io| ArchiveFromRootfsError::Scratch { dir: scratch, io })
}
