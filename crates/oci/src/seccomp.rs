//! The seccomp allowlist of the container tier, checked in as data (`data/seccomp.json`, in
//! the OCI `linux.seccomp` format) and described in docs/container-tier.md; a test keeps the
//! two in agreement.

use std::sync::OnceLock;

use serde_json::Value;

/// The profile's text, as checked in.
pub const PROFILE_JSON: &str = include_str!("../data/seccomp.json");

/// runsc's profile: allow by default, deny only namespace creation (`unshare`, `setns`,
/// `clone` with a namespace flag). The Sentry applies it to the code (`--oci-seccomp`).
pub const RUNSC_PROFILE_JSON: &str = include_str!("../data/seccomp-runsc.json");

/// runsc's profile, parsed once.
pub fn runsc_profile() -> &'static Value {
    static PROFILE: OnceLock<Value> = OnceLock::new();
    PROFILE.get_or_init(|| {
        serde_json::from_str(RUNSC_PROFILE_JSON)
            .expect("data/seccomp-runsc.json is valid JSON (tested)")
    })
}

/// The profile, parsed once.
pub fn profile() -> &'static Value {
    static PROFILE: OnceLock<Value> = OnceLock::new();
    PROFILE.get_or_init(|| {
        serde_json::from_str(PROFILE_JSON).expect("data/seccomp.json is valid JSON (tested)")
    })
}

/// SHA-256 of the checked-in profile text, for evidence.
pub fn profile_sha256() -> String {
    use sha2::Digest as _;
    hex::encode(sha2::Sha256::digest(PROFILE_JSON.as_bytes()))
}

/// SHA-256 of runsc's profile text, for evidence.
pub fn runsc_profile_sha256() -> String {
    use sha2::Digest as _;
    hex::encode(sha2::Sha256::digest(RUNSC_PROFILE_JSON.as_bytes()))
}

/// The syscalls allowed with no condition, sorted.
pub fn unconditional_allow(profile: &Value) -> Vec<String> {
    let mut names: Vec<String> = rules(profile)
        .filter(|r| r["action"] == "SCMP_ACT_ALLOW" && r.get("args").is_none())
        .flat_map(names_of)
        .collect();
    names.sort();
    names.dedup();
    names
}

/// One line per conditional rule (arguments or a non-allow action), in the form the doc's
/// table uses: `` | `name` | action | condition | ``, sorted.
pub fn conditional_rules(profile: &Value) -> Vec<String> {
    let mut out = Vec::new();
    for r in rules(profile) {
        let action = match r["action"].as_str().unwrap_or("?") {
            "SCMP_ACT_ALLOW" => "allow".to_owned(),
            "SCMP_ACT_ERRNO" => format!("errno {}", r["errnoRet"].as_u64().unwrap_or(1)),
            other => other.to_owned(),
        };
        let args = r.get("args").and_then(Value::as_array);
        if action == "allow" && args.is_none() {
            continue;
        }
        let condition = match args {
            None => "always".to_owned(),
            Some(args) => args
                .iter()
                .map(|a| {
                    let i = a["index"].as_u64().unwrap_or(0);
                    let v = a["value"].as_u64().unwrap_or(0);
                    match a["op"].as_str().unwrap_or("?") {
                        "SCMP_CMP_EQ" => format!("arg{i} == {v}"),
                        "SCMP_CMP_NE" => format!("arg{i} != {v}"),
                        "SCMP_CMP_MASKED_EQ" => {
                            format!("arg{i} & {v:#x} == {}", a["valueTwo"].as_u64().unwrap_or(0))
                        }
                        other => format!("arg{i} {other} {v}"),
                    }
                })
                .collect::<Vec<_>>()
                .join(" and "),
        };
        for name in names_of(r) {
            out.push(format!("| `{name}` | {action} | {condition} |"));
        }
    }
    out.sort();
    out
}

fn rules(profile: &Value) -> impl Iterator<Item = &Value> {
    profile["syscalls"].as_array().into_iter().flatten()
}

fn names_of(rule: &Value) -> impl Iterator<Item = String> + '_ {
    rule["names"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc() -> String {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/container-tier.md");
        std::fs::read_to_string(path).expect("docs/container-tier.md exists")
    }

    /// The text between `<!-- NAME:begin -->` and `<!-- NAME:end -->`.
    fn section<'a>(doc: &'a str, name: &str) -> &'a str {
        let begin = format!("<!-- {name}:begin -->");
        let end = format!("<!-- {name}:end -->");
        let start = doc
            .find(&begin)
            .unwrap_or_else(|| panic!("doc has no {begin}"))
            + begin.len();
        let stop = doc[start..]
            .find(&end)
            .unwrap_or_else(|| panic!("doc has no {end}"))
            + start;
        &doc[start..stop]
    }

    #[test]
    fn the_profile_is_an_allowlist_denying_with_eperm() {
        let p = profile();
        assert_eq!(p["defaultAction"], "SCMP_ACT_ERRNO");
        assert_eq!(p["defaultErrnoRet"], 1);
        assert_eq!(p["architectures"], serde_json::json!(["SCMP_ARCH_X86_64"]));
        let allowed = unconditional_allow(p);
        for needed in [
            "execve",
            "read",
            "write",
            "mmap",
            "futex",
            "rt_sigreturn",
            "exit_group",
            "arch_prctl",
        ] {
            assert!(
                allowed.iter().any(|n| n == needed),
                "{needed} must be allowed"
            );
        }
        for denied in [
            "mount",
            "umount2",
            "unshare",
            "setns",
            "ptrace",
            "bpf",
            "keyctl",
            "add_key",
            "perf_event_open",
            "io_uring_setup",
            "userfaultfd",
            "init_module",
            "kexec_load",
            "clone3",
            "clone",
            "socket",
            "personality",
            "open_by_handle_at",
            "pivot_root",
            "chroot",
            "reboot",
            "swapon",
            "process_vm_writev",
        ] {
            assert!(
                !allowed.iter().any(|n| n == denied),
                "{denied} must not be allowed unconditionally"
            );
        }
    }

    /// runsc's profile allows by default and denies exactly namespace creation: `unshare`,
    /// `setns`, and `clone` with each namespace flag (the flag bits are checked one by one).
    #[test]
    fn the_runsc_profile_denies_namespace_creation_only() {
        let p = runsc_profile();
        assert_eq!(p["defaultAction"], "SCMP_ACT_ALLOW");
        let rules = conditional_rules(p);
        let mut expected = vec![
            "| `setns` | errno 1 | always |".to_owned(),
            "| `unshare` | errno 1 | always |".to_owned(),
        ];
        for flag in [
            libc::CLONE_NEWNS,
            libc::CLONE_NEWCGROUP,
            libc::CLONE_NEWUTS,
            libc::CLONE_NEWIPC,
            libc::CLONE_NEWUSER,
            libc::CLONE_NEWPID,
            libc::CLONE_NEWNET,
        ] {
            expected.push(format!(
                "| `clone` | errno 1 | arg0 & {flag:#x} == {flag} |"
            ));
        }
        expected.sort();
        assert_eq!(rules, expected);
        let doc = doc();
        for row in &expected {
            assert!(
                section(&doc, "seccomp-runsc").contains(row.as_str()),
                "docs/container-tier.md seccomp-runsc lacks {row}"
            );
        }
    }

    #[test]
    fn the_doc_lists_exactly_the_profile() {
        let doc = doc();
        let p = profile();
        let listed: Vec<String> = {
            let mut v: Vec<String> = section(&doc, "seccomp-allow")
                .split(|c: char| c.is_whitespace() || c == '`' || c == ',')
                .filter(|w| !w.is_empty())
                .map(str::to_owned)
                .collect();
            v.sort();
            v
        };
        assert_eq!(
            listed,
            unconditional_allow(p),
            "docs/container-tier.md seccomp-allow differs from data/seccomp.json"
        );
        let mut rows: Vec<String> = section(&doc, "seccomp-rules")
            .lines()
            .map(str::trim)
            .filter(|l| l.starts_with("| `"))
            .map(str::to_owned)
            .collect();
        rows.sort();
        assert_eq!(
            rows,
            conditional_rules(p),
            "docs/container-tier.md seccomp-rules differs from data/seccomp.json"
        );
        assert!(
            doc.contains(&format!("{} syscalls", unconditional_allow(p).len())),
            "the doc states the count"
        );
    }
}
