//! What the seccomp validation tests share (crates/process/tests/seccomp.rs,
//! crates/oci/tests/seccomp.rs, crates/vm/tests/seccomp.rs): the list of raw system calls the
//! probe (`tests/seccomp/probe.py`, Python through ctypes) makes inside a real sandbox, what
//! each must give at each provider, and the judgement of the probe's answer.
//!
//! Allowed calls are made with every argument -1 (or harmless values where -1 would change
//! the probe itself): the kernel then answers EBADF, EFAULT, EINVAL, ESRCH or succeeds, never
//! EPERM, so an EPERM is the filter's (the container profile's default errno). Denied calls
//! are made with arguments for which the kernel without the filter would answer something
//! else (EBADF for `setns(-1, 0)`, ESRCH for `ptrace(-1, -1)`, EFAULT for the rest), so the
//! expected errno is the filter's own.

#![allow(
    dead_code,
    reason = "each provider's test uses a different part of this module"
)]

use std::collections::BTreeMap;
use std::path::Path;

pub const EPERM: i64 = 1;
pub const ENOSYS: i64 = 38;

/// What a call must give.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// Reaches the kernel: succeeds, or fails with any errno but EPERM.
    Reaches,
    /// Fails with exactly this errno.
    Errno(i64),
    /// Fails (any errno, or the child is killed): where the docs say "refused" without an errno.
    Fails,
}

#[derive(Debug, Clone)]
pub struct Check {
    pub label: String,
    pub nr: i64,
    /// Integers, or `"buf"`: the address of a zeroed 4 KiB buffer.
    pub args: Vec<serde_json::Value>,
    /// Made in a forked child (it would change the probe: namespaces, setsid, fork, clone).
    pub child: bool,
    pub expect: Expect,
}

/// Allowed unconditionally by the profile, but not made by the probe, with why.
pub const NOT_CALLED: &[(&str, &str)] = &[
    (
        "exit",
        "ends the probe; every forked child of the probe leaves through it",
    ),
    (
        "exit_group",
        "ends the probe; the probe's own end goes through it",
    ),
    (
        "rt_sigreturn",
        "only valid on a signal frame; Python's signal handling uses it",
    ),
    ("pause", "blocks until a signal"),
    (
        "vfork",
        "a raw vfork from Python would run the child on the parent's stack",
    ),
    (
        "set_tid_address",
        "would replace the pointer glibc's thread exit relies on",
    ),
    (
        "setgroups",
        "the kernel itself answers EPERM to a caller without CAP_SETGID, so the filter cannot be told apart",
    ),
];

/// Calls whose -1 arguments would change the probe, or draw an EPERM of the kernel's own
/// (gVisor's Sentry answers EPERM to these with -1), and the arguments used instead: a
/// read-only query of the clock, the caller's own I/O priority and scheduling parameters.
const ARGS: &[(&str, &[&str])] = &[
    ("alarm", &["0"]),
    ("umask", &["18"]),
    ("adjtimex", &["buf"]),
    ("clock_adjtime", &["0", "buf"]),
    ("ioprio_get", &["1", "0"]),
    ("ioprio_set", &["1", "0", "0"]),
    ("sched_rr_get_interval", &["0", "buf"]),
    ("sched_setparam", &["0", "buf"]),
];

/// Integer arguments as the probe takes them.
pub fn ints(args: &[i64]) -> Vec<serde_json::Value> {
    args.iter().map(|a| (*a).into()).collect()
}

fn words(args: &[&str]) -> Vec<serde_json::Value> {
    args.iter()
        .map(|a| match a.parse::<i64>() {
            Ok(n) => n.into(),
            Err(_) => (*a).into(),
        })
        .collect()
}

/// Calls made in a forked child: the probe is a process-group leader (setsid), or the call
/// makes a process.
const IN_CHILD: &[&str] = &["setsid", "fork"];

fn workspace() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

/// x86_64 system call numbers, from the kernel headers this host has.
pub fn numbers() -> Result<BTreeMap<String, i64>, String> {
    let path = "/usr/include/x86_64-linux-gnu/asm/unistd_64.h";
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {path} ({e}): install linux-libc-dev"))?;
    Ok(text
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("#define __NR_")?;
            let (name, nr) = rest.split_once(' ')?;
            Some((name.to_owned(), nr.trim().parse().ok()?))
        })
        .collect())
}

/// The names `crates/oci/data/seccomp.json` allows without a condition.
pub fn allowlist() -> Vec<String> {
    let path = workspace().join("crates/oci/data/seccomp.json");
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let mut names = Vec::new();
    for rule in v["syscalls"].as_array().unwrap() {
        if rule["action"] == "SCMP_ACT_ALLOW" && rule.get("args").is_none_or(|a| a.is_null()) {
            for n in rule["names"].as_array().unwrap() {
                names.push(n.as_str().unwrap().to_owned());
            }
        }
    }
    names
}

fn check(
    numbers: &BTreeMap<String, i64>,
    label: &str,
    name: &str,
    args: &[i64],
    child: bool,
    expect: Expect,
) -> Check {
    Check {
        label: label.to_owned(),
        nr: *numbers
            .get(name)
            .unwrap_or_else(|| panic!("no x86_64 number for {name}")),
        args: ints(args),
        child,
        expect,
    }
}

/// Every call of the container allowlist (but [`NOT_CALLED`] and `except`), each expected to
/// reach the kernel.
pub fn allowed(numbers: &BTreeMap<String, i64>, except: &[&str]) -> Vec<Check> {
    let mut out = Vec::new();
    for name in allowlist() {
        if NOT_CALLED.iter().any(|(n, _)| *n == name) || except.contains(&name.as_str()) {
            continue;
        }
        let args = ARGS
            .iter()
            .find(|(n, _)| *n == name)
            .map_or(ints(&[-1; 6]), |(_, a)| words(a));
        let child = IN_CHILD.contains(&name.as_str());
        let mut c = check(
            numbers,
            &format!("allow {name}"),
            &name,
            &[],
            child,
            Expect::Reaches,
        );
        if name != "fork" {
            c.args = args;
        }
        out.push(c);
    }
    // Conditional rules: clone without a namespace flag (a plain fork), personality's query.
    out.push(check(
        numbers,
        "allow clone(SIGCHLD)",
        "clone",
        &[17, 0, 0, 0, 0],
        true,
        Expect::Reaches,
    ));
    out.push(check(
        numbers,
        "allow personality(0xffffffff)",
        "personality",
        &[0xffff_ffff],
        false,
        Expect::Reaches,
    ));
    out
}

/// Namespace flags, by name.
pub const NAMESPACE_FLAGS: &[(&str, i64)] = &[
    ("CLONE_NEWNS", 0x0002_0000),
    ("CLONE_NEWCGROUP", 0x0200_0000),
    ("CLONE_NEWUTS", 0x0400_0000),
    ("CLONE_NEWIPC", 0x0800_0000),
    ("CLONE_NEWUSER", 0x1000_0000),
    ("CLONE_NEWPID", 0x2000_0000),
    ("CLONE_NEWNET", 0x4000_0000),
];

/// The namespace class: `unshare` and `clone` with each flag (in a child), `setns(-1, 0)`.
pub fn namespaces(numbers: &BTreeMap<String, i64>, expect: Expect, setns: Expect) -> Vec<Check> {
    let mut out = Vec::new();
    for (flag, bits) in NAMESPACE_FLAGS {
        out.push(check(
            numbers,
            &format!("deny unshare({flag})"),
            "unshare",
            &[*bits],
            true,
            expect,
        ));
        out.push(check(
            numbers,
            &format!("deny clone({flag}|SIGCHLD)"),
            "clone",
            &[*bits | 17, 0, 0, 0, 0],
            true,
            expect,
        ));
    }
    out.push(check(
        numbers,
        "deny setns(-1, 0)",
        "setns",
        &[-1, 0],
        false,
        setns,
    ));
    out
}

/// Calls denied with `errno`, each made with every argument -1.
pub fn denied(numbers: &BTreeMap<String, i64>, names: &[&str], errno: i64) -> Vec<Check> {
    names
        .iter()
        .map(|n| {
            check(
                numbers,
                &format!("deny {n}"),
                n,
                &[-1; 6],
                false,
                Expect::Errno(errno),
            )
        })
        .collect()
}

/// The probe's source with `checks` in place.
pub fn script(checks: &[Check]) -> String {
    let calls: Vec<serde_json::Value> = checks
        .iter()
        .map(
            |c| serde_json::json!({"label": c.label, "nr": c.nr, "args": c.args, "child": c.child}),
        )
        .collect();
    let probe = std::fs::read_to_string(workspace().join("tests/seccomp/probe.py")).unwrap();
    probe.replace("@CALLS@", &serde_json::to_string(&calls).unwrap())
}

/// Every check the answer does not satisfy, one line each (empty: all hold). A missing
/// answer, or threads that did not run, is a failure too.
/// Asserts that every check held in a run at `tier` (its result `r`), then says how many.
pub fn assert_all_held(tier: &str, checks: &[Check], r: &plimsoll_wire::RunResult) {
    let stdout = String::from_utf8_lossy(r.stdout.as_slice());
    let bad = judge(checks, &stdout);
    assert!(
        bad.is_empty() && r.exit_code == Some(0),
        "{} of {} checks failed at {tier}:\n{}\nexit {:?}, stderr {}",
        bad.len(),
        checks.len(),
        bad.join("\n"),
        r.exit_code,
        String::from_utf8_lossy(r.stderr.as_slice())
    );
    eprintln!("{tier}: {} seccomp checks held", checks.len());
}

pub fn judge(checks: &[Check], stdout: &str) -> Vec<String> {
    let Some(line) = stdout
        .lines()
        .find_map(|l| l.strip_prefix("SECCOMP-PROBE "))
    else {
        return vec![format!("the probe printed no answer: {stdout:?}")];
    };
    let answer: BTreeMap<String, (i64, i64)> = serde_json::from_str(line).unwrap();
    let mut bad = Vec::new();
    if answer.get("threads") != Some(&(1, 0)) {
        bad.push(format!("a thread did not run: {:?}", answer.get("threads")));
    }
    for c in checks {
        let Some(&(ret, errno)) = answer.get(&c.label) else {
            bad.push(format!("{}: no answer", c.label));
            continue;
        };
        let ok = match c.expect {
            Expect::Reaches => !(ret == -1 && errno == EPERM) && errno >= 0,
            Expect::Errno(e) => ret == -1 && errno == e,
            Expect::Fails => ret == -1,
        };
        if !ok {
            bad.push(format!(
                "{}: expected {:?}, got return {ret} errno {errno}",
                c.label, c.expect
            ));
        }
    }
    bad
}
