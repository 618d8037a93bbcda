//! QEMU's jail: what the QEMU process sees and may do, applied in the spawn hook between fork
//! and exec (so only system calls on values prepared before the fork).
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
//! Nothing else of the host is reachable: no `/proc`, `/sys`, `/etc`, `/home`, no state
//! directory, no other run. QEMU's own `-sandbox` (seccomp) comes on top, and there is no
//! network device.

use std::ffi::CString;
use std::io;
use std::os::fd::RawFd;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};

use plimsoll_sandbox::Stage;

/// The hook's steps, for error messages ([`Stage::enter`] indexes into this).
pub const STAGES: &[&str] = &[
    "mount namespace",
    "private mounts",
    "jail root",
    "jail contents",
    "pivot_root",
    "read-only root",
    "rlimits",
    "uid and gid",
    "parent death signal",
    "no_new_privs",
    "descriptors",
];

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
    parent: i32,
    fds: Vec<(RawFd, RawFd)>,
    empty: CString,
    tmpfs: CString,
    root_data: CString,
    tmp_data: CString,
    dot: CString,
    slash: CString,
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
    pub fds: Vec<(RawFd, RawFd)>,
}

/// The jail could not be prepared (before any fork).
#[derive(Debug, thiserror::Error)]
pub enum PrepareJailError {
    /// A path holds a NUL byte or cannot be read.
    #[error("jail path {0} is unusable")]
    Path(PathBuf),
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
            parent: std::process::id() as i32,
            fds: spec.fds.clone(),
            empty: cs(""),
            tmpfs: cs("tmpfs"),
            root_data: cs("size=1m,mode=0755"),
            tmp_data: cs("size=4m,mode=1777"),
            dot: cs("."),
            slash: cs("/"),
        })
    }

    /// Applies the jail in the child. Async-signal-safe: system calls only.
    pub fn apply(&self, stage: &Stage) -> io::Result<()> {
        let ok = |rc: libc::c_int| {
            if rc == 0 {
                Ok(())
            } else {
                Err(io::Error::last_os_error())
            }
        };
        let null = std::ptr::null::<libc::c_char>();
        // SAFETY: every call below is a plain system call on NUL-terminated
        // strings and integers prepared before the fork, which stay alive for the call; the
        // child is single-threaded here. Nothing allocates.
        unsafe {
            stage.enter(0);
            ok(libc::unshare(libc::CLONE_NEWNS))?;
            stage.enter(1);
            ok(libc::mount(
                null,
                self.slash.as_ptr(),
                null,
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ))?;
            stage.enter(2);
            ok(libc::mount(
                self.tmpfs.as_ptr(),
                self.root.as_ptr(),
                self.tmpfs.as_ptr(),
                libc::MS_NOSUID,
                self.root_data.as_ptr().cast(),
            ))?;
            stage.enter(3);
            for d in &self.dirs {
                ok(libc::mkdir(d.as_ptr(), 0o755))?;
            }
            for (target, link) in &self.symlinks {
                ok(libc::symlink(target.as_ptr(), link.as_ptr()))?;
            }
            for b in &self.binds {
                if !b.is_dir {
                    let fd = libc::open(
                        b.target.as_ptr(),
                        libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY | libc::O_CLOEXEC,
                        0o644,
                    );
                    if fd < 0 {
                        return Err(io::Error::last_os_error());
                    }
                    libc::close(fd);
                }
                ok(libc::mount(
                    b.source.as_ptr(),
                    b.target.as_ptr(),
                    null,
                    libc::MS_BIND,
                    std::ptr::null(),
                ))?;
                let mut flags =
                    libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY | libc::MS_NOSUID;
                if !b.device {
                    flags |= libc::MS_NODEV;
                }
                ok(libc::mount(
                    null,
                    b.target.as_ptr(),
                    null,
                    flags,
                    std::ptr::null(),
                ))?;
            }
            if let Some((path, dev)) = &self.kvm {
                ok(libc::mknod(path.as_ptr(), libc::S_IFCHR | 0o600, *dev))?;
                ok(libc::chown(path.as_ptr(), self.uid, self.gid))?;
            }
            ok(libc::mount(
                self.tmpfs.as_ptr(),
                self.tmp.as_ptr(),
                self.tmpfs.as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                self.tmp_data.as_ptr().cast(),
            ))?;
            stage.enter(4);
            ok(libc::chdir(self.root.as_ptr()))?;
            // pivot_root(".", "."): the old root ends up stacked under the new one and is
            // detached right away; nothing of the host's tree stays reachable.
            if libc::syscall(libc::SYS_pivot_root, self.dot.as_ptr(), self.dot.as_ptr()) != 0 {
                return Err(io::Error::last_os_error());
            }
            ok(libc::umount2(self.dot.as_ptr(), libc::MNT_DETACH))?;
            ok(libc::chdir(self.slash.as_ptr()))?;
            stage.enter(5);
            ok(libc::mount(
                null,
                self.slash.as_ptr(),
                null,
                libc::MS_REMOUNT | libc::MS_RDONLY | libc::MS_NOSUID,
                self.empty.as_ptr().cast(),
            ))?;
            stage.enter(6);
            let limit = |resource, value: u64| {
                let r = libc::rlimit {
                    rlim_cur: value,
                    rlim_max: value,
                };
                ok(libc::setrlimit(resource, &r))
            };
            limit(libc::RLIMIT_AS, self.address_space)?;
            limit(libc::RLIMIT_CORE, 0)?;
            stage.enter(7);
            // Empty the bounding and ambient capability sets while still root; numbers past
            // the kernel's last capability fail, harmlessly.
            for cap in 0..64 {
                libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0);
            }
            libc::prctl(
                libc::PR_CAP_AMBIENT,
                libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
                0,
                0,
                0,
            );
            ok(libc::setgroups(0, std::ptr::null()))?;
            ok(libc::setresgid(self.gid, self.gid, self.gid))?;
            ok(libc::setresuid(self.uid, self.uid, self.uid))?;
            stage.enter(8);
            // After the uid change: changing credentials clears the parent-death signal.
            ok(libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            ))?;
            if libc::getppid() != self.parent {
                // The daemon died before the signal was armed.
                libc::_exit(1);
            }
            stage.enter(9);
            ok(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))?;
            stage.enter(10);
            // First out of the way (a source may sit on a target number), then into place;
            // dup2's copies are not close-on-exec.
            let mut high = [0 as RawFd; 4];
            for (i, (from, _)) in self.fds.iter().enumerate().take(high.len()) {
                let fd = libc::fcntl(*from, libc::F_DUPFD_CLOEXEC, 100);
                if fd < 0 {
                    return Err(io::Error::last_os_error());
                }
                high[i] = fd;
            }
            for (i, (_, to)) in self.fds.iter().enumerate().take(high.len()) {
                if libc::dup2(high[i], *to) < 0 {
                    return Err(io::Error::last_os_error());
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prepares_the_view() {
        let j = Jail::prepare(&JailSpec {
            root: Path::new("/run/x/jail"),
            kernel: Path::new("/a/vmlinux"),
            initrd: Path::new("/a/initrd"),
            disk: Path::new("/a/disk.ext4"),
            kvm_device: None,
            uid: 7,
            gid: 8,
            address_space: 1 << 30,
            fds: vec![(9, 3)],
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
