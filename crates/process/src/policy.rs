//! The process tier's isolation policy as data: the seccomp deny list, the landlock path
//! rules and the rlimits. docs/isolation-tiers.md describes the same rules; a test checks
//! that every syscall named here is named there.

use std::path::Path;
use std::time::Duration;

use plimsoll_sandbox::ResolvedLimits;

/// What a denied syscall returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deny {
    /// `EPERM`: the call is refused.
    Eperm,
    /// `ENOSYS`: the call "does not exist", so the C library falls back to an older one.
    Enosys,
}

/// When a rule applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum When {
    /// On every call.
    Always,
    /// Only when argument 0 (clone's flags) asks for a new namespace; plain thread and
    /// process creation stays allowed.
    NamespaceFlags,
}

/// One seccomp rule. The filter's default is to allow.
#[derive(Debug, Clone, Copy)]
pub struct SyscallRule {
    /// The syscall's name.
    pub name: &'static str,
    /// Its number on this architecture.
    pub nr: libc::c_long,
    /// What it returns when denied.
    pub deny: Deny,
    /// When the rule applies.
    pub when: When,
    /// Why it is denied.
    pub why: &'static str,
}

const fn rule(name: &'static str, nr: libc::c_long, deny: Deny, why: &'static str) -> SyscallRule {
    SyscallRule {
        name,
        nr,
        deny,
        when: When::Always,
        why,
    }
}

const NET: &str = "no network: a socket of any family (the broker channel, when there is one, is an inherited descriptor)";
const URING: &str =
    "io_uring runs operations (including socket and connect) that seccomp never sees";
const TRACE: &str = "no reading or writing another process's memory";
const MOUNT: &str = "no changes to the mount table (these need privileges we never grant, denied for defence in depth)";
const NS: &str =
    "no new namespaces: an unprivileged user namespace opens kernel surface meant for root";
const KERNEL: &str = "kernel surface a snippet never needs";
const KEYS: &str = "keyrings are kept per uid by the kernel and would outlive the run";
const IPC: &str =
    "System V and POSIX message/shared-memory objects are host-wide and would outlive the run";
const MODULES: &str =
    "no kernel code loading (needs privileges we never grant, denied for defence in depth)";

/// The deny list. Everything else is allowed: the process tier is a hardened process, not a
/// wall (see docs/isolation-tiers.md).
pub const SECCOMP_RULES: &[SyscallRule] = &[
    rule("socket", libc::SYS_socket, Deny::Eperm, NET),
    rule(
        "io_uring_setup",
        libc::SYS_io_uring_setup,
        Deny::Eperm,
        URING,
    ),
    rule(
        "io_uring_enter",
        libc::SYS_io_uring_enter,
        Deny::Eperm,
        URING,
    ),
    rule(
        "io_uring_register",
        libc::SYS_io_uring_register,
        Deny::Eperm,
        URING,
    ),
    rule("ptrace", libc::SYS_ptrace, Deny::Eperm, TRACE),
    rule(
        "process_vm_readv",
        libc::SYS_process_vm_readv,
        Deny::Eperm,
        TRACE,
    ),
    rule(
        "process_vm_writev",
        libc::SYS_process_vm_writev,
        Deny::Eperm,
        TRACE,
    ),
    rule("mount", libc::SYS_mount, Deny::Eperm, MOUNT),
    rule("umount2", libc::SYS_umount2, Deny::Eperm, MOUNT),
    rule("pivot_root", libc::SYS_pivot_root, Deny::Eperm, MOUNT),
    rule("chroot", libc::SYS_chroot, Deny::Eperm, MOUNT),
    rule("open_tree", libc::SYS_open_tree, Deny::Eperm, MOUNT),
    rule("move_mount", libc::SYS_move_mount, Deny::Eperm, MOUNT),
    rule("fsopen", libc::SYS_fsopen, Deny::Eperm, MOUNT),
    rule("fsconfig", libc::SYS_fsconfig, Deny::Eperm, MOUNT),
    rule("fsmount", libc::SYS_fsmount, Deny::Eperm, MOUNT),
    rule("fspick", libc::SYS_fspick, Deny::Eperm, MOUNT),
    rule("mount_setattr", libc::SYS_mount_setattr, Deny::Eperm, MOUNT),
    rule("unshare", libc::SYS_unshare, Deny::Eperm, NS),
    rule("setns", libc::SYS_setns, Deny::Eperm, NS),
    SyscallRule {
        name: "clone",
        nr: libc::SYS_clone,
        deny: Deny::Eperm,
        when: When::NamespaceFlags,
        why: NS,
    },
    rule(
        "clone3",
        libc::SYS_clone3,
        Deny::Enosys,
        "its flags sit in memory seccomp cannot read; ENOSYS makes the C library fall back to clone, whose flags are checked",
    ),
    rule("bpf", libc::SYS_bpf, Deny::Eperm, KERNEL),
    rule(
        "perf_event_open",
        libc::SYS_perf_event_open,
        Deny::Eperm,
        KERNEL,
    ),
    rule("userfaultfd", libc::SYS_userfaultfd, Deny::Eperm, KERNEL),
    rule("keyctl", libc::SYS_keyctl, Deny::Eperm, KEYS),
    rule("add_key", libc::SYS_add_key, Deny::Eperm, KEYS),
    rule("request_key", libc::SYS_request_key, Deny::Eperm, KEYS),
    rule("shmget", libc::SYS_shmget, Deny::Eperm, IPC),
    rule("semget", libc::SYS_semget, Deny::Eperm, IPC),
    rule("msgget", libc::SYS_msgget, Deny::Eperm, IPC),
    rule("mq_open", libc::SYS_mq_open, Deny::Eperm, IPC),
    rule("kexec_load", libc::SYS_kexec_load, Deny::Eperm, MODULES),
    rule(
        "kexec_file_load",
        libc::SYS_kexec_file_load,
        Deny::Eperm,
        MODULES,
    ),
    rule("init_module", libc::SYS_init_module, Deny::Eperm, MODULES),
    rule("finit_module", libc::SYS_finit_module, Deny::Eperm, MODULES),
    rule(
        "delete_module",
        libc::SYS_delete_module,
        Deny::Eperm,
        MODULES,
    ),
];

/// clone flags that create a namespace (`CLONE_NEWTIME` is left out: for clone it shares a
/// bit with the exit signal, and only unshare/clone3 can use it, both denied).
pub const NAMESPACE_FLAGS: &[(&str, u64)] = &[
    ("CLONE_NEWNS", libc::CLONE_NEWNS as u64),
    ("CLONE_NEWCGROUP", libc::CLONE_NEWCGROUP as u64),
    ("CLONE_NEWUTS", libc::CLONE_NEWUTS as u64),
    ("CLONE_NEWIPC", libc::CLONE_NEWIPC as u64),
    ("CLONE_NEWUSER", libc::CLONE_NEWUSER as u64),
    ("CLONE_NEWPID", libc::CLONE_NEWPID as u64),
    ("CLONE_NEWNET", libc::CLONE_NEWNET as u64),
];

/// Directories the code may read and execute from.
pub const READ_EXEC_DIRS: &[&str] = &["/usr", "/lib", "/lib64", "/bin", "/etc"];
/// Device files the code may read and write.
pub const DEVICES: &[&str] = &["/dev/null", "/dev/zero", "/dev/urandom"];
/// Read-only, no execute.
pub const READ_ONLY_DIRS: &[&str] = &["/proc"];

/// Descriptors a run may hold at once.
pub const NOFILE: u64 = 256;

/// One resource limit, soft and hard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rlimit {
    /// `RLIMIT_*` name.
    pub name: &'static str,
    /// The resource.
    pub resource: rustix::process::Resource,
    /// Soft limit.
    pub soft: u64,
    /// Hard limit.
    pub hard: u64,
}

/// CPU seconds: the wall timeout rounded up, plus one (the wall deadline normally fires
/// first; this bounds a run whose deadline handling is late).
pub fn cpu_seconds(timeout: Duration) -> u64 {
    timeout.as_secs() + u64::from(timeout.subsec_nanos() > 0) + 1
}

/// The rlimits of a run.
pub fn rlimits(limits: &ResolvedLimits) -> [Rlimit; 6] {
    use rustix::process::Resource;
    let cpu = cpu_seconds(limits.timeout);
    let same = |name, resource, v| Rlimit {
        name,
        resource,
        soft: v,
        hard: v,
    };
    [
        Rlimit {
            name: "RLIMIT_CPU",
            resource: Resource::Cpu,
            soft: cpu,
            // SIGXCPU at the soft limit, SIGKILL one second later.
            hard: cpu + 1,
        },
        same("RLIMIT_AS", Resource::As, limits.memory_bytes),
        same("RLIMIT_NOFILE", Resource::Nofile, NOFILE),
        // Counted per uid; every run in flight has a uid of its own.
        same("RLIMIT_NPROC", Resource::Nproc, limits.pids),
        same("RLIMIT_FSIZE", Resource::Fsize, limits.disk_bytes),
        same("RLIMIT_CORE", Resource::Core, 0),
    ]
}

/// The landlock ABI this code is written and tested against; newer kernels are held to it,
/// older ones get what they support (best effort).
pub const LANDLOCK_ABI: landlock::ABI = landlock::ABI::V6;

/// The landlock ABI the running kernel offers (0 when it has none).
pub fn kernel_landlock_abi() -> i32 {
    plimsoll_sys::landlock::kernel_abi()
}

/// The landlock ABI a run is held to: the lower of ours and the kernel's.
pub fn enforced_landlock_abi() -> i32 {
    kernel_landlock_abi().min(LANDLOCK_ABI as i32)
}

/// Builds a run's landlock ruleset: read and execute on the system directories and the code
/// directory, read on /proc, read and write on a few devices, everything on the work
/// directory; TCP bind/connect denied (ABI 4+); abstract Unix sockets and signals scoped to
/// the sandbox (ABI 6+). Returns the ruleset's descriptor, or `None` when the kernel has no
/// landlock.
pub fn landlock_ruleset(
    code_dir: &Path,
    work_dir: &Path,
) -> Result<Option<std::os::fd::OwnedFd>, landlock::RulesetError> {
    use landlock::{
        Access, AccessFs, AccessNet, CompatLevel, Compatible, Ruleset, RulesetAttr,
        RulesetCreatedAttr, Scope, path_beneath_rules,
    };
    let abi = LANDLOCK_ABI;
    let read_exec: Vec<&Path> = READ_EXEC_DIRS
        .iter()
        .map(Path::new)
        .chain([code_dir])
        .collect();
    let created = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(AccessFs::from_all(abi))?
        .handle_access(AccessNet::from_all(abi))?
        .scope(Scope::from_all(abi))?
        .create()?
        .add_rules(path_beneath_rules(read_exec, AccessFs::from_read(abi)))?
        .add_rules(path_beneath_rules(
            READ_ONLY_DIRS,
            AccessFs::ReadFile | AccessFs::ReadDir,
        ))?
        .add_rules(path_beneath_rules(
            DEVICES,
            AccessFs::ReadFile | AccessFs::WriteFile,
        ))?
        .add_rules(path_beneath_rules([work_dir], AccessFs::from_all(abi)))?;
    Ok(created.into())
}

/// One compiled seccomp program (classic BPF).
pub use seccompiler::BpfProgram;

/// Could not build the seccomp filters.
#[derive(Debug, thiserror::Error)]
pub enum CompileSeccompError {
    /// This architecture is not one we build filters for.
    #[error("seccomp filters are built for x86_64 and aarch64 only, not {0}")]
    Arch(&'static str),
    /// seccompiler refused the rules.
    #[error("cannot compile the seccomp rules")]
    Compile(#[source] seccompiler::BackendError),
}

/// Compiles the deny list into filters to install in order: one per error value, plus (on
/// x86_64) a guard that refuses every x32 syscall, whose numbers would slip past the others.
pub fn seccomp_filters() -> Result<Vec<BpfProgram>, CompileSeccompError> {
    use std::collections::BTreeMap;

    use seccompiler::{
        SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
        SeccompRule, TargetArch,
    };
    let arch = std::env::consts::ARCH;
    let target = TargetArch::try_from(arch).map_err(|_| CompileSeccompError::Arch(arch))?;
    let mut programs = Vec::new();
    for (deny, errno) in [(Deny::Eperm, libc::EPERM), (Deny::Enosys, libc::ENOSYS)] {
        let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
        for r in SECCOMP_RULES.iter().filter(|r| r.deny == deny) {
            let chain = match r.when {
                When::Always => Vec::new(),
                When::NamespaceFlags => NAMESPACE_FLAGS
                    .iter()
                    .map(|(_, flag)| {
                        let cond = SeccompCondition::new(
                            0,
                            SeccompCmpArgLen::Qword,
                            SeccompCmpOp::MaskedEq(*flag),
                            *flag,
                        )?;
                        SeccompRule::new(vec![cond])
                    })
                    .collect::<Result<_, _>>()
                    .map_err(CompileSeccompError::Compile)?,
            };
            #[allow(clippy::useless_conversion, reason = "c_long is i32 on 32-bit targets")]
            rules.insert(i64::from(r.nr), chain);
        }
        if rules.is_empty() {
            continue;
        }
        let filter = SeccompFilter::new(
            rules,
            SeccompAction::Allow,
            SeccompAction::Errno(errno as u32),
            target,
        )
        .map_err(CompileSeccompError::Compile)?;
        programs.push(filter.try_into().map_err(CompileSeccompError::Compile)?);
    }
    if arch == "x86_64" {
        programs.push(x32_guard());
    }
    Ok(programs)
}

/// A filter returning ENOSYS for every x32 syscall (number with bit 30 set). x32 calls carry
/// the x86_64 audit arch, so without this `socket | 0x40000000` would not match `socket`.
fn x32_guard() -> BpfProgram {
    const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
    const X32_SYSCALL_BIT: u32 = 0x4000_0000;
    const LD_W_ABS: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
    const JEQ_K: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
    const JGE_K: u16 = 0x35; // BPF_JMP | BPF_JGE | BPF_K
    const RET_K: u16 = 0x06; // BPF_RET | BPF_K
    const RET_ALLOW: u32 = 0x7fff_0000;
    const RET_KILL_PROCESS: u32 = 0x8000_0000;
    const RET_ERRNO: u32 = 0x0005_0000;
    let op = |code, jt, jf, k| seccompiler::sock_filter { code, jt, jf, k };
    vec![
        op(LD_W_ABS, 0, 0, 4), // seccomp_data.arch
        op(JEQ_K, 1, 0, AUDIT_ARCH_X86_64),
        op(RET_K, 0, 0, RET_KILL_PROCESS),
        op(LD_W_ABS, 0, 0, 0), // seccomp_data.nr
        op(JGE_K, 0, 1, X32_SYSCALL_BIT),
        op(RET_K, 0, 0, RET_ERRNO | libc::ENOSYS as u32),
        op(RET_K, 0, 0, RET_ALLOW),
    ]
}

/// A one-line summary per error value, for evidence.
pub fn seccomp_summary() -> Vec<(String, String)> {
    let names = |deny: Deny, when: When| -> String {
        SECCOMP_RULES
            .iter()
            .filter(|r| r.deny == deny && r.when == when)
            .map(|r| r.name)
            .collect::<Vec<_>>()
            .join(" ")
    };
    let flags: Vec<&str> = NAMESPACE_FLAGS.iter().map(|(n, _)| *n).collect();
    vec![
        ("seccomp.default".into(), "allow".into()),
        ("seccomp.eperm".into(), names(Deny::Eperm, When::Always)),
        (
            "seccomp.eperm_when_namespace_flags".into(),
            format!(
                "{} ({})",
                names(Deny::Eperm, When::NamespaceFlags),
                flags.join("|")
            ),
        ),
        (
            "seccomp.enosys".into(),
            format!("{} x32-syscalls", names(Deny::Enosys, When::Always)),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_seconds_round_up_plus_one() {
        assert_eq!(cpu_seconds(Duration::from_secs(10)), 11);
        assert_eq!(cpu_seconds(Duration::from_millis(10_001)), 12);
        assert_eq!(cpu_seconds(Duration::from_millis(1)), 2);
    }

    #[test]
    fn filters_compile() {
        let f = seccomp_filters().unwrap();
        assert!(f.len() >= 2);
        assert!(f.iter().all(|p| !p.is_empty() && p.len() < 4096));
    }

    #[test]
    fn every_rule_is_in_the_doc() {
        let doc = include_str!("../../../docs/isolation-tiers.md");
        for r in SECCOMP_RULES {
            assert!(
                doc.contains(&format!("`{}`", r.name)),
                "docs/isolation-tiers.md does not name `{}`",
                r.name
            );
        }
        for (flag, _) in NAMESPACE_FLAGS {
            assert!(
                doc.contains(flag),
                "docs/isolation-tiers.md does not name {flag}"
            );
        }
        for (name, _) in rlimits(&ResolvedLimits {
            timeout: Duration::from_secs(1),
            memory_bytes: 1,
            output_bytes: 1,
            pids: 1,
            disk_bytes: 1,
            artifact_bytes: 1,
        })
        .map(|r| (r.name, r.soft))
        {
            assert!(
                doc.contains(name),
                "docs/isolation-tiers.md does not name {name}"
            );
        }
        for p in READ_EXEC_DIRS.iter().chain(DEVICES).chain(READ_ONLY_DIRS) {
            assert!(
                doc.contains(&format!("`{p}`")),
                "docs/isolation-tiers.md does not name `{p}`"
            );
        }
    }

    #[test]
    fn names_match_numbers() {
        // A sample, guarding against a copy-paste slip in the table.
        let find = |n: &str| SECCOMP_RULES.iter().find(|r| r.name == n).unwrap().nr;
        assert_eq!(find("socket"), libc::SYS_socket);
        assert_eq!(find("clone3"), libc::SYS_clone3);
        assert_eq!(find("unshare"), libc::SYS_unshare);
        let mut seen = std::collections::BTreeSet::new();
        assert!(
            SECCOMP_RULES.iter().all(|r| seen.insert(r.nr)),
            "a syscall is listed twice"
        );
    }
}
