//! The VM assets (built by scripts/build-vm-assets) and the run initramfs the provider makes
//! from them: the base initramfs with a second archive appended that holds the tools
//! (`plimsoll-guest-init`, `plimsoll-agent`, `plimsoll-probe`, and for trial runs a second
//! one with `plimsoll-trial-runner` too) as configured, so the guest always runs the binaries
//! the evidence names.

use std::fs;
use std::io::{self, Write as _};
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use plimsoll_wire::BinaryIdentity;
use sha2::{Digest as _, Sha256};

use crate::cpio;

/// The files scripts/build-vm-assets writes.
#[derive(Debug, Clone)]
pub struct Assets {
    /// The directory.
    pub dir: PathBuf,
    /// The PVH kernel ELF.
    pub kernel: PathBuf,
    /// The base initramfs.
    pub initramfs: PathBuf,
    /// The image disk (ext4).
    pub disk: PathBuf,
    /// The guest kernel's release.
    pub kernel_release: String,
    /// The sandbox image identity the disk was made from.
    pub image_identity: String,
    /// The manifest's text.
    pub manifest: String,
}

/// The assets are missing or incomplete.
#[derive(Debug, thiserror::Error)]
pub enum OpenAssetsError {
    /// A file is missing or unreadable.
    #[error("VM asset {path} is missing or unreadable: run scripts/build-vm-assets")]
    Missing {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// A file holds something unexpected.
    #[error("VM asset {path} is malformed ({why}): rebuild with scripts/build-vm-assets --force")]
    Malformed {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
}

impl Assets {
    /// Opens the assets in `dir`, checking that every file is there.
    pub fn open(dir: &Path) -> Result<Assets, OpenAssetsError> {
        let read = |name: &str| {
            let path = dir.join(name);
            fs::read_to_string(&path)
                .map(|t| t.trim().to_owned())
                .map_err(|source| OpenAssetsError::Missing { path, source })
        };
        let kernel_release = read("kernel-release")?;
        let image_identity = read("image-identity")?;
        let manifest = read("manifest")?;
        if !image_identity.starts_with("sha256:") {
            return Err(OpenAssetsError::Malformed {
                path: dir.join("image-identity"),
                why: "not sha256:<hex>".into(),
            });
        }
        let a = Assets {
            dir: dir.to_owned(),
            kernel: dir.join("vmlinux"),
            initramfs: dir.join("initramfs.cpio.gz"),
            disk: dir.join("disk.ext4"),
            kernel_release,
            image_identity,
            manifest,
        };
        for p in [&a.kernel, &a.initramfs, &a.disk] {
            fs::metadata(p).map_err(|source| OpenAssetsError::Missing {
                path: p.clone(),
                source,
            })?;
        }
        Ok(a)
    }

    /// The `name sha256:<hex>` value the manifest records for `key` (`vmlinux`, `disk`, ...).
    pub fn manifest_sha256(&self, key: &str) -> Option<&str> {
        self.manifest.lines().find_map(|l| {
            let mut w = l.split_whitespace();
            (w.next() == Some(key))
                .then(|| w.find_map(|x| x.strip_prefix("sha256:")))
                .flatten()
        })
    }
}

pub use plimsoll_sandbox::evidence::sha256_file;

/// The initramfs a run boots: base + tools.
#[derive(Debug, Clone)]
pub struct RunInitrd {
    /// The file (world-readable, named by its digest).
    pub path: PathBuf,
    /// Its SHA-256.
    pub sha256: String,
    /// The tools inside, with their digests.
    pub tools: Vec<BinaryIdentity>,
}

/// The run initramfs could not be made.
#[derive(Debug, thiserror::Error)]
pub enum BuildInitrdError {
    /// A tool binary or the base initramfs is unreadable.
    #[error("cannot read {path}: build it (cargo build) or configure its path")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The result could not be written.
    #[error("cannot write {path}")]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
}

/// An ELF64 executable cut after the last byte any program header covers, without its
/// section header table: what the kernel and the dynamic loader use stays byte for byte, the
/// debug data and symbol tables (most of a debug build) go. `None` when `elf` is not a
/// little-endian ELF64 file or has nothing past its segments.
pub fn strip_elf(elf: &[u8]) -> Option<Vec<u8>> {
    let u16_at = |o: usize| Some(u16::from_le_bytes(elf.get(o..o + 2)?.try_into().ok()?));
    let u64_at = |o: usize| Some(u64::from_le_bytes(elf.get(o..o + 8)?.try_into().ok()?));
    if elf.get(..6)? != b"\x7fELF\x02\x01" {
        return None;
    }
    let phoff = usize::try_from(u64_at(0x20)?).ok()?;
    let phentsize = usize::from(u16_at(0x36)?);
    let phnum = usize::from(u16_at(0x38)?);
    if phentsize < 56 || phnum == 0 {
        return None;
    }
    let mut end = phoff.checked_add(phentsize.checked_mul(phnum)?)?.max(64);
    for i in 0..phnum {
        let ph = phoff + i * phentsize;
        let offset = u64_at(ph + 8)?;
        let filesz = u64_at(ph + 32)?;
        end = end.max(usize::try_from(offset.checked_add(filesz)?).ok()?);
    }
    if end >= elf.len() {
        return None;
    }
    let mut out = elf[..end].to_vec();
    // e_shoff = 0, e_shnum = 0, e_shstrndx = 0: no section headers.
    out[0x28..0x30].fill(0);
    out[0x3c..0x40].fill(0);
    Some(out)
}

/// Writes `<out_dir>/initrd-<sha256 prefix>.img`: the base initramfs, then a `tools/`
/// archive with each `(name, path)` (mode 0755), ELF files without their debug data
/// ([`strip_elf`]; the identities name the files as configured). Unchanged inputs give the
/// same file.
pub fn build_run_initrd(
    base: &Path,
    tools: &[(&str, &Path)],
    out_dir: &Path,
) -> Result<RunInitrd, BuildInitrdError> {
    let read = |p: &Path| {
        fs::read(p).map_err(|source| BuildInitrdError::Read {
            path: p.to_owned(),
            source,
        })
    };
    let mut bytes = read(base)?;
    let mut entries = vec![cpio::Entry::Dir {
        path: "tools".into(),
        mode: 0o755,
    }];
    let mut identities = Vec::new();
    for (name, path) in tools {
        let file = read(path)?;
        let data = strip_elf(&file).unwrap_or_else(|| file.clone());
        identities.push(BinaryIdentity {
            name: (*name).to_owned(),
            path: path.display().to_string(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            sha256: hex::encode(Sha256::digest(&file)),
        });
        entries.push(cpio::Entry::File {
            path: format!("tools/{name}"),
            mode: 0o755,
            data,
        });
    }
    cpio::append(&mut bytes, &entries);
    let sha256 = hex::encode(Sha256::digest(&bytes));
    let path = out_dir.join(format!("initrd-{}.img", &sha256[..16]));
    let write_err = |source| BuildInitrdError::Write {
        path: path.clone(),
        source,
    };
    if sha256_file(&path).ok().as_deref() != Some(sha256.as_str()) {
        fs::create_dir_all(out_dir).map_err(write_err)?;
        let tmp = out_dir.join(format!(".initrd-{}.{}", &sha256[..16], std::process::id()));
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o644)
            .open(&tmp)
            .map_err(write_err)?;
        f.write_all(&bytes).map_err(write_err)?;
        f.sync_all().map_err(write_err)?;
        fs::set_permissions(&tmp, fs::Permissions::from_mode(0o644)).map_err(write_err)?;
        fs::rename(&tmp, &path).map_err(write_err)?;
    }
    Ok(RunInitrd {
        path,
        sha256,
        tools: identities,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_initrd_is_base_plus_tools_and_stable() {
        let tmp = tempfile::tempdir().unwrap();
        let base = tmp.path().join("base.cpio.gz");
        fs::write(&base, b"BASE").unwrap();
        let tool = tmp.path().join("agent");
        fs::write(&tool, b"\x7fELF agent").unwrap();
        let out = tmp.path().join("out");
        let a = build_run_initrd(&base, &[("plimsoll-agent", &tool)], &out).unwrap();
        let bytes = fs::read(&a.path).unwrap();
        assert!(bytes.starts_with(b"BASE"));
        assert!(
            bytes
                .windows(b"tools/plimsoll-agent".len())
                .any(|w| w == b"tools/plimsoll-agent")
        );
        assert_eq!(sha256_file(&a.path).unwrap(), a.sha256);
        assert_eq!(
            a.tools[0].sha256,
            hex::encode(Sha256::digest(b"\x7fELF agent"))
        );
        let b = build_run_initrd(&base, &[("plimsoll-agent", &tool)], &out).unwrap();
        assert_eq!(a.path, b.path);
        assert!(build_run_initrd(&base, &[("x", &tmp.path().join("missing"))], &out).is_err());
    }

    /// The test binary itself, stripped, still runs.
    #[test]
    fn a_stripped_executable_runs() {
        let me = std::env::current_exe().unwrap();
        let full = fs::read(&me).unwrap();
        let stripped = strip_elf(&full).expect("a debug test binary has debug data to drop");
        assert!(stripped.len() < full.len());
        assert_eq!(&stripped[..4], b"\x7fELF");
        let tmp = tempfile::tempdir().unwrap();
        let copy = tmp.path().join("stripped");
        fs::write(&copy, &stripped).unwrap();
        fs::set_permissions(&copy, fs::Permissions::from_mode(0o755)).unwrap();
        let mut r = plimsoll_sandbox::Spawn::new(&copy, tmp.path())
            .args(["--list", "--format", "terse"])
            .spawn()
            .unwrap();
        let mut out = String::new();
        std::io::Read::read_to_string(&mut r.stdout, &mut out).unwrap();
        assert!(r.child.wait().unwrap().success());
        assert!(out.contains("a_stripped_executable_runs: test"), "{out}");
        assert_eq!(strip_elf(b"#!/bin/sh\n"), None);
        assert_eq!(strip_elf(&stripped), None, "nothing left to strip");
    }

    #[test]
    fn reads_the_manifest() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        assert!(matches!(
            Assets::open(d),
            Err(OpenAssetsError::Missing { .. })
        ));
        for f in ["vmlinux", "initramfs.cpio.gz", "disk.ext4"] {
            fs::write(d.join(f), b"x").unwrap();
        }
        fs::write(d.join("kernel-release"), "6.1.0-57-cloud-amd64\n").unwrap();
        fs::write(d.join("image-identity"), "sha256:abc\n").unwrap();
        fs::write(
            d.join("manifest"),
            "# plimsoll-vm-assets/v1\nvmlinux sha256:aa 12\ndisk sha256:bb 34 ext4\n",
        )
        .unwrap();
        let a = Assets::open(d).unwrap();
        assert_eq!(a.kernel_release, "6.1.0-57-cloud-amd64");
        assert_eq!(a.manifest_sha256("disk"), Some("bb"));
        assert_eq!(a.manifest_sha256("vmlinux"), Some("aa"));
        assert_eq!(a.manifest_sha256("initramfs"), None);
    }
}
