//! The broker process's seccomp allowlist, as data: every syscall it may make, with why.
//! Any other kills the process (`SECCOMP_RET_KILL_PROCESS`); docs/privileges.md lists the
//! same table, and a test checks that every syscall named here is named there.
//!
//! Arguments are checked where a call is wider than the broker needs: `clone` only for a
//! thread (a new process could `exec` what the filter forbids the broker itself; there is no
//! `execve` here anyway), `socket` only in the families it uses, `ioctl` and `prctl` only
//! for the requests the standard library makes. `clone3`, whose flags seccomp cannot read,
//! answers `ENOSYS`, so the C library starts threads with `clone`.

use std::collections::BTreeMap;
use std::io;

use seccompiler::{
    SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule,
    TargetArch,
};

/// What a rule lets through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Args {
    /// Any arguments.
    Any,
    /// Argument `index` equal to one of `values`.
    OneOf(u8, &'static [u64]),
    /// Argument `index` with every bit of `mask` set.
    HasBits(u8, u64),
}

/// One allowed syscall.
#[derive(Debug, Clone, Copy)]
pub struct Allowed {
    /// Its name.
    pub name: &'static str,
    /// Its number on this architecture.
    pub nr: libc::c_long,
    /// Which arguments.
    pub args: Args,
    /// Why the broker needs it.
    pub why: &'static str,
}

/// An allowed syscall, whatever its arguments.
pub const fn any(name: &'static str, nr: libc::c_long, why: &'static str) -> Allowed {
    Allowed {
        name,
        nr,
        args: Args::Any,
        why,
    }
}

const MEMORY: &str = "the allocator and thread stacks";
const THREADS: &str = "the process's threads (the broker's: one per channel connection)";
const SIGNALS: &str = "the standard library's and the runtime's signal setup, and a panic's abort";
const TIME: &str = "deadlines, timeouts, budgets and receipt times";
const IO: &str = "frames on the runs' channels, the control socket, upstream connections";
const FILES: &str = "the resolver's files (/etc/hosts, /etc/resolv.conf, /etc/nsswitch.conf, its NSS modules) and the TLS roots";
const NET: &str = "upstream connections (API calls, egress), DNS, and the channels it is handed";
const POLL: &str = "waiting on a channel, a listener, the stop eventfd, or an upstream socket";

/// Address families the broker opens sockets in: Unix (the NSS daemon's socket), IPv4 and
/// IPv6 (upstream, DNS), netlink (the resolver's `AI_ADDRCONFIG` check of local addresses).
const FAMILIES: &[u64] = &[
    libc::AF_UNIX as u64,
    libc::AF_INET as u64,
    libc::AF_INET6 as u64,
    libc::AF_NETLINK as u64,
];

/// `ioctl` requests: non-blocking mode, bytes readable, and whether a descriptor is a
/// terminal (the log's colour check).
const IOCTLS: &[u64] = &[libc::FIONBIO, libc::FIONREAD, libc::TCGETS];

/// What any plimsoll process that filters itself needs to run Rust with threads: memory,
/// thread starts and ends (`clone` only for a thread), signal setup, naming a thread, the
/// stack limit, the clock. Each filtering process compiles it with its own list.
pub const RUNTIME: &[Allowed] = &[
    any("brk", libc::SYS_brk, MEMORY),
    any("mmap", libc::SYS_mmap, MEMORY),
    any("munmap", libc::SYS_munmap, MEMORY),
    any("mremap", libc::SYS_mremap, MEMORY),
    any("mprotect", libc::SYS_mprotect, MEMORY),
    any("madvise", libc::SYS_madvise, MEMORY),
    Allowed {
        name: "clone",
        nr: libc::SYS_clone,
        args: Args::HasBits(0, libc::CLONE_THREAD as u64),
        why: "threads only (CLONE_THREAD): never a new process",
    },
    any("set_robust_list", libc::SYS_set_robust_list, THREADS),
    any("rseq", libc::SYS_rseq, THREADS),
    any("futex", libc::SYS_futex, THREADS),
    any("sched_yield", libc::SYS_sched_yield, THREADS),
    any("sched_getaffinity", libc::SYS_sched_getaffinity, THREADS),
    any("exit", libc::SYS_exit, THREADS),
    any("exit_group", libc::SYS_exit_group, "the process's end"),
    any("gettid", libc::SYS_gettid, THREADS),
    any("getpid", libc::SYS_getpid, SIGNALS),
    any("tgkill", libc::SYS_tgkill, SIGNALS),
    any("rt_sigaction", libc::SYS_rt_sigaction, SIGNALS),
    any("rt_sigprocmask", libc::SYS_rt_sigprocmask, SIGNALS),
    any("rt_sigreturn", libc::SYS_rt_sigreturn, SIGNALS),
    any("sigaltstack", libc::SYS_sigaltstack, SIGNALS),
    Allowed {
        name: "prctl",
        nr: libc::SYS_prctl,
        args: Args::OneOf(0, &[libc::PR_SET_NAME as u64]),
        why: "naming a thread (PR_SET_NAME) only",
    },
    any(
        "prlimit64",
        libc::SYS_prlimit64,
        "the standard library reads the stack limit",
    ),
    any("clock_gettime", libc::SYS_clock_gettime, TIME),
    any("clock_nanosleep", libc::SYS_clock_nanosleep, TIME),
    any("nanosleep", libc::SYS_nanosleep, TIME),
    any("gettimeofday", libc::SYS_gettimeofday, TIME),
];

/// The broker process's own allowlist, beside [`RUNTIME`].
pub const ALLOWED: &[Allowed] = &[
    any(
        "uname",
        libc::SYS_uname,
        "the resolver reads the host name for its search domain",
    ),
    any(
        "getrandom",
        libc::SYS_getrandom,
        "TLS to the upstream API, JWT ids",
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
        why: "Unix, IPv4, IPv6 and netlink sockets only",
    },
    any("connect", libc::SYS_connect, NET),
    any("bind", libc::SYS_bind, "the resolver's netlink socket"),
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
        "operations and the descriptors they hand over",
    ),
    any(
        "sendmmsg",
        libc::SYS_sendmmsg,
        "the resolver asks for A and AAAA at once",
    ),
    any("shutdown", libc::SYS_shutdown, NET),
    any("accept4", libc::SYS_accept4, "a run's channel listener"),
    any("poll", libc::SYS_poll, POLL),
    any("ppoll", libc::SYS_ppoll, POLL),
    any(
        "eventfd2",
        libc::SYS_eventfd2,
        "the stop signal of a run's listener",
    ),
];

/// Syscalls that answer `ENOSYS` rather than kill: the C library falls back from them.
pub const FALLBACK: &[Fallback] = &[(
    "clone3",
    libc::SYS_clone3,
    "its flags are in memory seccomp cannot read, so threads start with clone instead",
)];

/// A syscall that answers `ENOSYS` rather than kill: its name, number, and why.
pub type Fallback = (&'static str, libc::c_long, &'static str);

fn compile() -> io::Result<Vec<seccompiler::BpfProgram>> {
    compile_lists(&[RUNTIME, ALLOWED], FALLBACK)
}

/// An allowlist and its fallbacks as two filters: the fallbacks' `ENOSYS` first, then the
/// allowlist, which kills the process on any other call. Shared by every plimsoll process
/// that filters itself (the broker process, the split daemon's serving process).
pub fn compile_lists(
    allowed: &[&[Allowed]],
    fallbacks: &[Fallback],
) -> io::Result<Vec<seccompiler::BpfProgram>> {
    let err = |e: seccompiler::BackendError| io::Error::other(e.to_string());
    let target = TargetArch::try_from(std::env::consts::ARCH)
        .map_err(|_| io::Error::other("no seccomp filter for this architecture"))?;
    let cond = |index: u8, op: SeccompCmpOp, value: u64| {
        SeccompCondition::new(index, SeccompCmpArgLen::Qword, op, value).map_err(err)
    };
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for a in allowed.iter().copied().flatten() {
        let chain = match a.args {
            Args::Any => Vec::new(),
            Args::OneOf(index, values) => values
                .iter()
                .map(|v| SeccompRule::new(vec![cond(index, SeccompCmpOp::Eq, *v)?]).map_err(err))
                .collect::<io::Result<_>>()?,
            Args::HasBits(index, mask) => vec![
                SeccompRule::new(vec![cond(index, SeccompCmpOp::MaskedEq(mask), mask)?])
                    .map_err(err)?,
            ],
        };
        #[allow(clippy::useless_conversion, reason = "c_long is i32 on 32-bit targets")]
        rules.insert(i64::from(a.nr), chain);
    }
    // The fallbacks pass the allowlist and meet their errno in the filter after it.
    let mut fallback: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for (_, nr, _) in fallbacks {
        #[allow(clippy::useless_conversion, reason = "c_long is i32 on 32-bit targets")]
        rules.insert(i64::from(*nr), Vec::new());
        #[allow(clippy::useless_conversion, reason = "c_long is i32 on 32-bit targets")]
        fallback.insert(i64::from(*nr), Vec::new());
    }
    let allow = SeccompFilter::new(
        rules,
        SeccompAction::KillProcess,
        SeccompAction::Allow,
        target,
    )
    .map_err(err)?;
    let enosys = SeccompFilter::new(
        fallback,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        target,
    )
    .map_err(err)?;
    // The allowlist last: it forbids seccomp(2) itself. (Every filter sees every call and
    // the strictest answer wins, so the order changes nothing else.)
    Ok(vec![
        enosys.try_into().map_err(err)?,
        allow.try_into().map_err(err)?,
    ])
}

/// Installs the filters on the calling thread; threads it starts later inherit them. Needs
/// `no_new_privs` (the broker process is started with it).
pub fn install() -> io::Result<()> {
    install_programs(compile()?)
}

/// Installs `allowed` and `fallbacks` ([`compile_lists`]) on the calling thread.
pub fn install_lists(allowed: &[&[Allowed]], fallbacks: &[Fallback]) -> io::Result<()> {
    install_programs(compile_lists(allowed, fallbacks)?)
}

fn install_programs(programs: Vec<seccompiler::BpfProgram>) -> io::Result<()> {
    for program in programs {
        plimsoll_sys::seccomp::Filter::new(program.iter().map(|i| (i.code, i.jt, i.jf, i.k)))?
            .install()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_filters_compile_and_name_each_syscall_once() {
        assert_eq!(compile().unwrap().len(), 2);
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
        for name in &names {
            assert!(
                doc.contains(&format!("| `{name}` |")),
                "docs/privileges.md does not list {name} in the broker process's allowlist"
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
            "kill",
            "process_vm_readv",
            "io_uring_setup",
            "bpf",
            "unshare",
            "setns",
        ] {
            assert!(!names.contains(&forbidden), "{forbidden} is allowed");
        }
    }
}
