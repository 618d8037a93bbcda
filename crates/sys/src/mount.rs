//! Mount namespaces and mounts. Every function takes its paths as C strings (prepared before
//! a fork) and is a system call or a few, so each may run between fork and exec (as an
//! [`crate::exec::Step`]). The one place a mount namespace is set up:
//! [`enter_mount_namespace`].

use std::ffi::CStr;
use std::io;

use rustix::fs::{Mode, OFlags};
pub use rustix::mount::MountFlags;
use rustix::mount::{MountPropagationFlags, UnmountFlags};

/// How the new namespace's mounts relate to the ones they were copied from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Propagation {
    /// Nothing propagates either way.
    Private,
    /// Mounts and unmounts of the parent namespace still arrive; nothing goes back.
    Slave,
}

/// A mount namespace of the calling thread's own (unshare(2) `CLONE_NEWNS`), with every
/// mount made recursively `propagation`, so nothing done in it reaches the host's.
/// Needs CAP_SYS_ADMIN. Async-signal-safe.
pub fn enter_mount_namespace(propagation: Propagation) -> io::Result<()> {
    // SAFETY: rustix marks unshare unsafe for CLONE_FILES (a thread could then see a
    // descriptor table other threads do not); CLONE_NEWNS copies only the mount table.
    unsafe { rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWNS) }?;
    let flags = match propagation {
        Propagation::Private => MountPropagationFlags::PRIVATE,
        Propagation::Slave => MountPropagationFlags::DOWNSTREAM,
    };
    rustix::mount::mount_change(c"/", flags | MountPropagationFlags::REC)?;
    Ok(())
}

/// Mounts a tmpfs named `source` on `target` with `flags` and options `data`.
pub fn mount_tmpfs(source: &CStr, target: &CStr, flags: MountFlags, data: &CStr) -> io::Result<()> {
    rustix::mount::mount(source, target, c"tmpfs", flags, Some(data))?;
    Ok(())
}

/// Unmounts `target`, detached (a file left open there does not keep it).
pub fn unmount_detached(target: &CStr) -> io::Result<()> {
    rustix::mount::unmount(target, UnmountFlags::DETACH)?;
    Ok(())
}

/// Binds `source` on `target`, read-only and nosuid (and nodev unless `device`); a file's
/// `target` is created first, as an empty file (it must not exist).
pub fn bind_read_only(source: &CStr, target: &CStr, is_dir: bool, device: bool) -> io::Result<()> {
    if !is_dir {
        let fd = rustix::fs::open(
            target,
            OFlags::CREATE | OFlags::EXCL | OFlags::WRONLY | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o644),
        )?;
        drop(fd);
    }
    rustix::mount::mount_bind(source, target)?;
    let mut flags = MountFlags::BIND | MountFlags::RDONLY | MountFlags::NOSUID;
    if !device {
        flags |= MountFlags::NODEV;
    }
    rustix::mount::mount_remount(target, flags, c"")?;
    Ok(())
}

/// Makes the character device node `path` (`dev`, permission bits `mode`) owned by
/// `uid`:`gid`.
pub fn char_device(path: &CStr, dev: u64, mode: u32, uid: u32, gid: u32) -> io::Result<()> {
    rustix::fs::mknodat(
        rustix::fs::CWD,
        path,
        rustix::fs::FileType::CharacterDevice,
        Mode::from_raw_mode(mode),
        dev,
    )?;
    rustix::fs::chown(
        path,
        Some(rustix::fs::Uid::from_raw(uid)),
        Some(rustix::fs::Gid::from_raw(gid)),
    )?;
    Ok(())
}

/// Makes `root` the root: pivot_root(".", ".") from inside it, so the old root ends up
/// stacked under the new one, and detaches the old one at once; nothing of the old tree
/// stays reachable.
pub fn pivot_into(root: &CStr) -> io::Result<()> {
    rustix::process::chdir(root)?;
    rustix::process::pivot_root(c".", c".")?;
    unmount_detached(c".")?;
    rustix::process::chdir(c"/")?;
    Ok(())
}

/// Remounts `/` read-only and nosuid.
pub fn remount_root_read_only() -> io::Result<()> {
    rustix::mount::mount_remount(c"/", MountFlags::RDONLY | MountFlags::NOSUID, c"")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::{PreExec, Step};

    fn root() -> bool {
        rustix::process::geteuid().is_root()
    }

    #[test]
    fn without_privilege_nothing_is_mounted() {
        if root() {
            return;
        }
        assert!(enter_mount_namespace(Propagation::Private).is_err());
        assert!(remount_root_read_only().is_err());
    }

    #[test]
    fn a_child_gets_a_private_tmpfs_and_a_read_only_bind() {
        if !root() {
            eprintln!("SKIP a_child_gets_a_private_tmpfs_and_a_read_only_bind: needs root");
            return;
        }
        let dir = std::env::temp_dir().join(format!("plimsoll-sys-mount-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let c = |s: &str| std::ffi::CString::new(s).unwrap();
        let d = dir.to_str().unwrap();
        let pre = PreExec::new()
            .step("ns", Step::MountNamespace(Propagation::Private))
            .step(
                "tmpfs",
                Step::MountTmpfs {
                    source: c("plimsoll-test"),
                    target: c(d),
                    flags: MountFlags::NOSUID | MountFlags::NODEV,
                    data: c("size=64k,mode=0755"),
                },
            )
            .step(
                "bind",
                Step::BindReadOnly {
                    source: c("/bin/sh"),
                    target: c(&format!("{d}/sh")),
                    is_dir: false,
                    device: false,
                },
            );
        #[expect(clippy::disallowed_methods, reason = "a test of the mount steps")]
        let mut cmd = std::process::Command::new("/bin/sh");
        cmd.args([
            "-c",
            &format!("grep -c ' {d} tmpfs' /proc/self/mounts; echo x > {d}/sh || echo ro"),
        ]);
        let stages = pre.install(&mut cmd).unwrap();
        let out = cmd.output();
        let out = match out {
            Ok(o) => o,
            Err(e) => panic!("{:?}: {e}", stages.failed_step()),
        };
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.starts_with("1\n"), "{text}");
        assert!(text.contains("ro"), "{text}");
        // Nothing of it reached this namespace.
        assert!(
            !std::fs::read_to_string("/proc/self/mounts")
                .unwrap()
                .contains(d)
        );
        let _ = std::fs::remove_dir(&dir);
    }
}
