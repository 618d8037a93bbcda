//! The split daemon's serving process's seccomp allowlist, as data: every syscall it may make,
//! with why. Any other kills the process (`SECCOMP_RET_KILL_PROCESS`). docs/privileges.md
//! lists the same table, and a test checks that every syscall named here is named there.
//!
//! The serving process parses every request and much of what sandboxes send back, so what it
//! may do once running is the list below and nothing else. It never starts a process (no
//! `execve`, `clone` only for a thread), never changes its ids or mounts, never traces or
//! signals another process. Its sockets are its listener's connections, the launcher's Unix
//! socket and the runtime's own wakeup pair.

use plimsoll_broker::apart::filter::{Allowed, Args, Fallback, RUNTIME, any};

const IO: &str = "requests and answers, the launcher's frames, the log";
const FILES: &str = "the callers file, the image store's manifests, the evidence's binaries, uid lease files, /proc/self";
const NET: &str = "the listener's connections and the launcher's socket";
const POLL: &str = "the runtime's reactor";

/// Unix (the launcher, the runtime's wakeup pair), IPv4 and IPv6 (clients).
const FAMILIES: &[u64] = &[
    libc::AF_UNIX as u64,
    libc::AF_INET as u64,
    libc::AF_INET6 as u64,
];

/// `ioctl` requests: non-blocking mode, bytes readable, whether a descriptor is a terminal.
const IOCTLS: &[u64] = &[libc::FIONBIO, libc::FIONREAD, libc::TCGETS];

/// The serving process's own allowlist, beside the shared runtime list
/// (`plimsoll_broker::apart::filter::RUNTIME`).
pub const ALLOWED: &[Allowed] = &[
    any(
        "restart_syscall",
        libc::SYS_restart_syscall,
        "a sleep resumed after a signal",
    ),
    any(
        "getrandom",
        libc::SYS_getrandom,
        "request-independent ids (run, session), hash seeds",
    ),
    any(
        "geteuid",
        libc::SYS_geteuid,
        "where uid leases live depends on it",
    ),
    any(
        "getuid",
        libc::SYS_getuid,
        "the standard library and the logs",
    ),
    any("read", libc::SYS_read, IO),
    any("write", libc::SYS_write, IO),
    any("readv", libc::SYS_readv, IO),
    any("writev", libc::SYS_writev, IO),
    any("pread64", libc::SYS_pread64, FILES),
    any("close", libc::SYS_close, IO),
    any("openat", libc::SYS_openat, FILES),
    any("newfstatat", libc::SYS_newfstatat, FILES),
    any("fstat", libc::SYS_fstat, FILES),
    any("statx", libc::SYS_statx, FILES),
    any("lseek", libc::SYS_lseek, FILES),
    any("getdents64", libc::SYS_getdents64, FILES),
    any("access", libc::SYS_access, FILES),
    any(
        "readlink",
        libc::SYS_readlink,
        "finding its own program (/proc/self/exe), beside which the tools are",
    ),
    any(
        "mkdir",
        libc::SYS_mkdir,
        "its lease directory, when it is not there yet",
    ),
    any(
        "flock",
        libc::SYS_flock,
        "uid leases: a lock on one file per uid",
    ),
    any("fcntl", libc::SYS_fcntl, IO),
    Allowed {
        name: "ioctl",
        nr: libc::SYS_ioctl,
        args: Args::OneOf(1, IOCTLS),
        why: "FIONBIO, FIONREAD and TCGETS only",
    },
    Allowed {
        name: "socket",
        nr: libc::SYS_socket,
        args: Args::OneOf(0, FAMILIES),
        why: "Unix, IPv4 and IPv6 sockets only",
    },
    any(
        "socketpair",
        libc::SYS_socketpair,
        "the runtime's signal wakeups, and the stream of each operation on the broker process",
    ),
    any("connect", libc::SYS_connect, NET),
    any("accept4", libc::SYS_accept4, "the listener's connections"),
    any("getsockname", libc::SYS_getsockname, NET),
    any("getpeername", libc::SYS_getpeername, NET),
    any("setsockopt", libc::SYS_setsockopt, NET),
    any("getsockopt", libc::SYS_getsockopt, NET),
    any("sendto", libc::SYS_sendto, NET),
    any("recvfrom", libc::SYS_recvfrom, NET),
    any("sendmsg", libc::SYS_sendmsg, NET),
    any(
        "recvmsg",
        libc::SYS_recvmsg,
        "the launcher's frames and the broker channel's ends beside them",
    ),
    any("shutdown", libc::SYS_shutdown, NET),
    any("poll", libc::SYS_poll, POLL),
    any("ppoll", libc::SYS_ppoll, POLL),
    any("epoll_create1", libc::SYS_epoll_create1, POLL),
    any("epoll_ctl", libc::SYS_epoll_ctl, POLL),
    any("epoll_wait", libc::SYS_epoll_wait, POLL),
    any("epoll_pwait", libc::SYS_epoll_pwait, POLL),
    any("eventfd2", libc::SYS_eventfd2, POLL),
    any("pipe2", libc::SYS_pipe2, POLL),
    any(
        "wait4",
        libc::SYS_wait4,
        "reaping the launcher, its child, when it ends (and logging how)",
    ),
];

/// Syscalls that answer `ENOSYS` rather than kill: the C library and the standard library
/// fall back from them.
pub const FALLBACK: &[Fallback] = &[
    (
        "clone3",
        libc::SYS_clone3,
        "its flags are in memory seccomp cannot read, so threads start with clone instead",
    ),
    (
        "copy_file_range",
        libc::SYS_copy_file_range,
        "the standard library's copy tries it, then reads and writes",
    ),
    (
        "sendfile",
        libc::SYS_sendfile,
        "the standard library's copy tries it, then reads and writes",
    ),
    (
        "splice",
        libc::SYS_splice,
        "the standard library's copy tries it, then reads and writes",
    ),
    (
        "statfs",
        libc::SYS_statfs,
        "the standard library asks which file system a cgroup file is on, and does without",
    ),
];

/// Installs the allowlist on the calling thread; threads it starts later inherit it. Needs
/// no_new_privs.
pub fn install() -> std::io::Result<()> {
    plimsoll_broker::apart::filter::install_lists(&[RUNTIME, ALLOWED], FALLBACK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_syscall_is_named_once_and_listed_in_the_docs() {
        let mut names: Vec<&str> = RUNTIME.iter().chain(ALLOWED).map(|a| a.name).collect();
        names.extend(FALLBACK.iter().map(|f| f.0));
        let n = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), n, "a syscall named twice");
        let doc = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/privileges.md"),
        )
        .unwrap();
        let section = doc
            .split("### The serving process's allowlist")
            .nth(1)
            .and_then(|s| s.split("\n## ").next())
            .expect("docs/privileges.md lists the serving process's allowlist");
        for name in &names {
            assert!(
                section.contains(&format!("| `{name}` |")),
                "docs/privileges.md does not list {name} in the serving process's allowlist"
            );
        }
        for forbidden in [
            "execve",
            "execveat",
            "fork",
            "vfork",
            "ptrace",
            "mount",
            "setuid",
            "setresuid",
            "kill",
            "process_vm_readv",
            "io_uring_setup",
            "bpf",
            "unshare",
            "setns",
            "chmod",
            "unlink",
            "unlinkat",
        ] {
            assert!(!names.contains(&forbidden), "{forbidden} is allowed");
        }
    }
}
