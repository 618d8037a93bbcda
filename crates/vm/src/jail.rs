//! QEMU's jail: what the QEMU process sees and may do, applied between fork and exec as
//! plimsoll-sys pre-exec steps (so only system calls on values prepared before the fork).
//!
//! In order: a mount namespace of its own with every mount private; a fresh tmpfs as its
//! root holding only read-only bind mounts of `/usr` (QEMU, its libraries and firmware),
//! `/dev/null`, `/dev/zero`, `/dev/urandom`, the kernel, the initramfs and the image disk
//! (under `/vm`), a private `/tmp`, and `/dev/kvm` only when KVM is used (a node of its own
//! owned by the run's uid); `pivot_root` into it, the old root detached, the new root
//! read-only; `RLIMIT_AS` and `RLIMIT_CORE`; empty bounding and ambient capability sets; the
//! run's unprivileged uid and gid with no supplementary groups; `PR_SET_PDEATHSIG` (SIGKILL when the daemon's thread dies);
//! no-new-privs; and the channel descriptors at fixed numbers (3, and 4 for QMP).
//!
//! The mount namespace is plimsoll-sys's one way to make one
//! ([`plimsoll_sys::mount::enter_mount_namespace`]).
//!
//! Nothing else of the host is reachable: no `/proc`, `/sys`, `/etc`, `/home`, no state
//! directory, no other run. QEMU's own `-sandbox` (seccomp) comes on top, and there is no
//! network device.

use std::ffi::CString;
use std::os::fd::{BorrowedFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};

use plimsoll_sandbox::{PreExec, Step};
use plimsoll_sys::mount::Propagation;
use rustix::mount::MountFlags;
use rustix::process::{Pid, Resource, Signal};

/// Where things are inside the jail.
pub mod inside {
    /// The kernel.
    pub const KERNEL: &str = "/vm/kernel";
    /// The initramfs (base + tools).
    pub const INITRD: &str = "/vm/initrd";
    /// The image disk.
    pub const DISK: &str = "/vm/disk";
    /// The channel's descriptor in QEMU.
    pub const CHANNEL_FD: i32 = 3;
    /// The QMP monitor's descriptor in QEMU (probe boots only).
    pub const QMP_FD: i32 = 4;
    /// The broker channel's descriptor in QEMU (runs with a grant only).
    pub const BROKER_FD: i32 = 5;
    /// The egress port's descriptor in QEMU (runs with an egress grant only).
    pub const EGRESS_FD: i32 = 6;
}

/// One read-only bind mount into the jail.
#[derive(Debug)]
struct Bind {
    source: CString,
    /// Absolute host path of the mount point (inside the jail root, before pivot_root).
    target: CString,
    is_dir: bool,
    /// Device nodes need the mount without `nodev`.
    device: bool,
}

/// Everything the hook needs, prepared before the fork.
#[derive(Debug)]
pub struct Jail {
    root: CString,
    dirs: Vec<CString>,
    symlinks: Vec<(CString, CString)>,
    binds: Vec<Bind>,
    tmp: CString,
    kvm: Option<(CString, u64)>,
    uid: u32,
    gid: u32,
    address_space: u64,
    parent: Pid,
    fds: Vec<(OwnedFd, RawFd)>,
}

/// What to put in the jail.
#[derive(Debug)]
pub struct JailSpec<'a> {
    /// An empty directory (in the run directory) to mount the jail's root on.
    pub root: &'a Path,
    /// The kernel, initramfs and disk on the host.
    pub kernel: &'a Path,
    /// The initramfs.
    pub initrd: &'a Path,
    /// The image disk.
    pub disk: &'a Path,
    /// `/dev/kvm`'s device number, when KVM is used.
    pub kvm_device: Option<u64>,
    /// The run's uid and gid.
    pub uid: u32,
    /// The gid.
    pub gid: u32,
    /// `RLIMIT_AS` of QEMU.
    pub address_space: u64,
    /// Descriptors to hand QEMU: (descriptor in the daemon, number in QEMU).
    pub fds: Vec<(BorrowedFd<'a>, RawFd)>,
}

/// The jail could not be prepared (before any fork).
#[derive(Debug, thiserror::Error)]
pub enum PrepareJailError {
    /// A path holds a NUL byte or cannot be read.
    #[error("jail path {0} is unusable")]
    Path(PathBuf),
    /// A descriptor for QEMU could not be copied.
    #[error("cannot copy a descriptor for QEMU")]
    Descriptor(#[source] std::io::Error),
}

fn c(p: &Path) -> Result<CString, PrepareJailError> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| PrepareJailError::Path(p.to_owned()))
}

fn cs(s: &str) -> CString {
    // Only constant strings without NUL bytes come here.
    CString::new(s).unwrap_or_default()
}

impl Jail {
    /// Prepares the jail for one QEMU process.
    pub fn prepare(spec: &JailSpec<'_>) -> Result<Jail, PrepareJailError> {
        let root = spec.root;
        let at = |p: &str| c(&root.join(p.trim_start_matches('/')));
        let mut dirs = Vec::new();
        for d in ["/usr", "/dev", "/vm", "/tmp"] {
            dirs.push(at(d)?);
        }
        // The top-level links of a merged-/usr host (lib -> usr/lib, ...), as the host has them,
        // so the dynamic loader and QEMU's libraries are found at their usual paths.
        let mut symlinks = Vec::new();
        for name in ["bin", "sbin", "lib", "lib64", "lib32", "libx32"] {
            let host = Path::new("/").join(name);
            if let Ok(target) = std::fs::read_link(&host) {
                symlinks.push((c(&target)?, at(name)?));
            }
        }
        let mut binds = vec![Bind {
            source: cs("/usr"),
            target: at("/usr")?,
            is_dir: true,
            device: false,
        }];
        for dev in ["null", "zero", "urandom"] {
            binds.push(Bind {
                source: cs(&format!("/dev/{dev}")),
                target: at(&format!("/dev/{dev}"))?,
                is_dir: false,
                device: true,
            });
        }
        for (host, inside) in [
            (spec.kernel, inside::KERNEL),
            (spec.initrd, inside::INITRD),
            (spec.disk, inside::DISK),
        ] {
            binds.push(Bind {
                source: c(host)?,
                target: at(inside)?,
                is_dir: false,
                device: false,
            });
        }
        let kvm = match spec.kvm_device {
            Some(dev) => Some((at("/dev/kvm")?, dev)),
            None => None,
        };
        Ok(Jail {
            root: c(root)?,
            dirs,
            symlinks,
            binds,
            tmp: at("/tmp")?,
            kvm,
            uid: spec.uid,
            gid: spec.gid,
            address_space: spec.address_space,
            parent: rustix::process::getpid(),
            fds: spec
                .fds
                .iter()
                .map(|(fd, at)| Ok((fd.try_clone_to_owned()?, *at)))
                .collect::<Result<_, std::io::Error>>()
                .map_err(PrepareJailError::Descriptor)?,
        })
    }

    /// The steps QEMU's child takes between fork and exec, in order (plimsoll-sys runs
    /// them there: system calls only, on values prepared here).
    pub fn into_pre_exec(self) -> PreExec {
        let mut pre = PreExec::new()
            .step(
                "mount namespace",
                Step::MountNamespace(Propagation::Private),
            )
            .step(
                "jail root",
                Step::MountTmpfs {
                    source: cs("tmpfs"),
                    target: self.root.clone(),
                    flags: MountFlags::NOSUID,
                    data: cs("size=1m,mode=0755"),
                },
            );
        let contents = "jail contents";
        for path in self.dirs {
            pre = pre.step(contents, Step::Mkdir { path, mode: 0o755 });
        }
        for (target, link) in self.symlinks {
            pre = pre.step(contents, Step::Symlink { target, link });
        }
        for b in self.binds {
            pre = pre.step(
                contents,
                Step::BindReadOnly {
                    source: b.source,
                    target: b.target,
                    is_dir: b.is_dir,
                    device: b.device,
                },
            );
        }
        if let Some((path, dev)) = self.kvm {
            pre = pre.step(
                contents,
                Step::CharDevice {
                    path,
                    dev,
                    mode: 0o600,
                    uid: self.uid,
                    gid: self.gid,
                },
            );
        }
        let (uid, gid) = (Some(self.uid), Some(self.gid));
        pre.step(
            contents,
            Step::MountTmpfs {
                source: cs("tmpfs"),
                target: self.tmp,
                flags: MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
                data: cs("size=4m,mode=1777"),
            },
        )
        .step("pivot_root", Step::PivotRoot(self.root))
        .step("read-only root", Step::RemountRootReadOnly)
        .step(
            "rlimits",
            Step::Rlimit {
                resource: Resource::As,
                soft: self.address_space,
                hard: self.address_space,
            },
        )
        .step("rlimits", Step::no_core_dumps())
        // Empty the bounding and ambient capability sets while still root.
        .step("uid and gid", Step::LimitBoundingSet(0))
        .step("uid and gid", Step::DropGroups)
        .step("uid and gid", Step::SetGids(gid, gid, gid))
        .step("uid and gid", Step::SetUids(uid, uid, uid))
        // After the uid change: changing credentials clears the parent-death signal.
        .step("parent death signal", Step::ParentDeathSignal(Signal::KILL))
        // The daemon died before the signal was armed.
        .step("parent death signal", Step::RequireParent(self.parent))
        .step("no_new_privs", Step::NoNewPrivs)
        // dup2's copies are not close-on-exec.
        .step("descriptors", Step::PlaceFds(self.fds))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_steps_run_in_the_documented_order() {
        let null = std::fs::File::open("/dev/null").unwrap();
        let j = Jail::prepare(&JailSpec {
            root: Path::new("/run/x/jail"),
            kernel: Path::new("/a/vmlinux"),
            initrd: Path::new("/a/initrd"),
            disk: Path::new("/a/disk.ext4"),
            kvm_device: Some(1),
            uid: 7,
            gid: 8,
            address_space: 1 << 30,
            fds: vec![(std::os::fd::AsFd::as_fd(&null), 3)],
        })
        .unwrap();
        let mut names = j.into_pre_exec().names();
        names.dedup();
        assert_eq!(
            names,
            [
                "mount namespace",
                "jail root",
                "jail contents",
                "pivot_root",
                "read-only root",
                "rlimits",
                "uid and gid",
                "parent death signal",
                "no_new_privs",
                "descriptors",
            ]
        );
    }

    #[test]
    fn prepares_the_view() {
        let null = std::fs::File::open("/dev/null").unwrap();
        let j = Jail::prepare(&JailSpec {
            root: Path::new("/run/x/jail"),
            kernel: Path::new("/a/vmlinux"),
            initrd: Path::new("/a/initrd"),
            disk: Path::new("/a/disk.ext4"),
            kvm_device: None,
            uid: 7,
            gid: 8,
            address_space: 1 << 30,
            fds: vec![(std::os::fd::AsFd::as_fd(&null), 3)],
        })
        .unwrap();
        let targets: Vec<String> = j
            .binds
            .iter()
            .map(|b| b.target.to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            targets,
            [
                "/run/x/jail/usr",
                "/run/x/jail/dev/null",
                "/run/x/jail/dev/zero",
                "/run/x/jail/dev/urandom",
                "/run/x/jail/vm/kernel",
                "/run/x/jail/vm/initrd",
                "/run/x/jail/vm/disk",
            ]
        );
        assert!(j.kvm.is_none());
        assert!(
            Jail::prepare(&JailSpec {
                root: Path::new("/bad\0path"),
                kernel: Path::new("/k"),
                initrd: Path::new("/i"),
                disk: Path::new("/d"),
                kvm_device: Some(1),
                uid: 7,
                gid: 7,
                address_space: 1,
                fds: vec![],
            })
            .is_err()
        );
    }
}
