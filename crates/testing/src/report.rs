//! Probe reports for judging tests: [`meeting`] builds one that meets a provider's
//! `Expectations`, so each test breaks only what it names.

use plimsoll_sandbox::judge::{Expectations, HostView, Identity, Kernel, Limits};
use plimsoll_wire::{NamespaceSeen, ProbeReport};

/// A report that meets `e` on `host`: every check `e` names passes on it.
pub fn meeting(e: &Expectations, host: &HostView) -> ProbeReport {
    let (uid, gid, groups) = match e.identity {
        Identity::Uid(id) => (id, id, vec![id]),
        Identity::UidAndGid { uid, gid } => (uid, gid, vec![]),
    };
    let cwd = match &e.work_dir {
        Some(w) => format!("/run/plimsoll/p/runs/probe{}", w.suffix),
        None => "/work".to_owned(),
    };
    let mut r = ProbeReport {
        uid,
        euid: uid,
        gid,
        groups,
        no_new_privs: true,
        seccomp_mode: 2,
        environment: e.environment.clone(),
        cwd: cwd.clone(),
        network_interfaces: vec!["lo".into()],
        hostname: "sandbox".into(),
        kernel_release: match &e.kernel {
            None | Some(Kernel::TheHosts) => host.kernel_release.clone(),
            Some(Kernel::NotTheHosts) => "4.4.0".into(),
            Some(Kernel::Guest { release }) => release.clone(),
        },
        ..ProbeReport::default()
    };
    for set in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        r.capabilities.insert(set.into(), "0000000000000000".into());
    }
    for (name, id) in &host.namespaces {
        r.namespaces.insert(
            name.clone(),
            NamespaceSeen {
                // Never the host's, whatever the host's is.
                id: format!("{id}-sandbox"),
                same_as_host: None,
            },
        );
    }
    r.mounts.insert("/".into(), "ro".into());
    r.mounts.insert("/sys".into(), "ro".into());
    r.write_attempts.insert(cwd, "writable".into());
    r.write_attempts
        .insert("/etc".into(), "error: Read-only file system".into());
    r.write_attempts
        .insert("/usr".into(), "error: Permission denied".into());
    if let Some(fs) = &e.filesystem {
        for w in &fs.must_be_writable {
            r.mounts.insert(w.clone(), "rw".into());
            r.write_attempts.insert(w.clone(), "writable".into());
        }
    }
    if let Some(w) = &e.work_dir {
        for p in &w.must_try {
            r.write_attempts
                .insert(p.clone(), "error: Permission denied".into());
        }
    }
    r.read_attempts
        .insert("/etc/shadow".into(), "error: Permission denied".into());
    r.read_attempts
        .insert("/run/plimsoll/canary".into(), "error: not found".into());
    for family in ["AF_INET", "AF_INET6", "AF_UNIX"] {
        r.socket_attempts
            .insert(family.into(), "error: Permission denied".into());
    }
    if let Some(Limits::Cgroup {
        memory_keys,
        memory,
        pids_keys,
        pids,
    }) = &e.limits
    {
        r.limits.insert(memory_keys[0].clone(), memory.to_string());
        r.limits.insert(pids_keys[0].clone(), pids.to_string());
    }
    r
}
