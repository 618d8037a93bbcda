//! The VM provider's disk of an image: `scripts/make-image-disk` (mke2fs of the root file
//! system, timestamps fixed, checked) run over the image's rootfs, the disk put beside it as
//! `disk.ext4` with `disk.identity`, the identity it was made from.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use plimsoll_sandbox::{CaptureLimits, Spawn, capture};

use crate::store::StoredImage;

/// The disk could not be made; the image is as it was (no disk, or its old one).
#[derive(Debug, thiserror::Error)]
pub enum MakeVmDiskError {
    /// The script could not be started.
    #[error("cannot run {}", script.display())]
    Start {
        /// The script.
        script: PathBuf,
        /// Why.
        #[source]
        source: plimsoll_sandbox::SpawnError,
    },
    /// The script failed.
    #[error("{} failed for image {name}: {said}", script.display())]
    Failed {
        /// The script.
        script: PathBuf,
        /// The image.
        name: String,
        /// Its status and the last line it printed.
        said: String,
    },
    /// The finished disk could not be put in place.
    #[error("cannot put the disk of image {name} in place")]
    Place {
        /// The image.
        name: String,
        /// Why.
        #[source]
        io: std::io::Error,
    },
}

/// Makes `image`'s VM disk with `script` (`scripts/make-image-disk ROOTFS OUT`): written to
/// a temporary file in the image's directory, renamed to `disk.ext4`, then `disk.identity`
/// written, so the store counts the disk only once it is whole ([`StoredImage::disk`]).
pub fn make_vm_disk(image: &StoredImage, script: &Path) -> Result<PathBuf, MakeVmDiskError> {
    let tmp = image.at.dir.join(".disk.ext4.tmp");
    let disk = image.at.dir.join("disk.ext4");
    let name = image.name().to_owned();
    let running = Spawn::new(script, "/")
        .env(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        )
        .arg(image.at.rootfs())
        .arg(&tmp)
        .spawn()
        .map_err(|source| MakeVmDiskError::Start {
            script: script.to_owned(),
            source,
        })?;
    let failed = |said: String| MakeVmDiskError::Failed {
        script: script.to_owned(),
        name: name.clone(),
        said,
    };
    let got = capture(
        running,
        &CaptureLimits::new(256 << 10, Duration::from_secs(3600)),
    )
    .map_err(|e| failed(e.to_string()))?;
    if got.exit_code != Some(0) {
        let _ = fs::remove_file(&tmp);
        let text = String::from_utf8_lossy(&got.stderr);
        return Err(failed(format!(
            "exit {:?}, signal {:?}: {}",
            got.exit_code,
            got.signal,
            text.trim_end().lines().last().unwrap_or("")
        )));
    }
    let place = |io| MakeVmDiskError::Place {
        name: name.clone(),
        io,
    };
    // The old disk's identity goes first: a disk without one is never counted.
    match fs::remove_file(image.at.dir.join("disk.identity")) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(place(e)),
    }
    fs::rename(&tmp, &disk).map_err(place)?;
    fs::write(
        image.at.dir.join("disk.identity"),
        format!("{}\n", image.identity),
    )
    .map_err(place)?;
    Ok(disk)
}
