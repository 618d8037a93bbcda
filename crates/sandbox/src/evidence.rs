//! Judging a probe, the parts every provider does alike: a check's verdict in the checks
//! map, a binary's digest, and the tier-neutral checks of a [`ProbeReport`] (uid, host files,
//! environment, the host's kernel), used by [`crate::judge`], the one judging table.

use std::collections::BTreeMap;
use std::path::Path;

use plimsoll_wire::ProbeReport;

/// Memory limit of a container's or a guest's probe run (its cgroup must show it).
pub const PROBE_MEMORY: u64 = 256 << 20;
/// Pids limit of a container's or a guest's probe run (before runsc's allowance).
pub const PROBE_PIDS: u64 = 32;

/// The limits a container's or a guest's probe runs under.
pub fn probe_limits() -> crate::ResolvedLimits {
    crate::ResolvedLimits {
        timeout: std::time::Duration::from_secs(60),
        memory_bytes: PROBE_MEMORY,
        output_bytes: 1 << 20,
        pids: PROBE_PIDS,
        disk_bytes: 16 << 20,
        artifact_bytes: 1 << 20,
    }
}

/// What a passed check says in the checks map.
pub const OK: &str = "ok";

/// Records check `name`: `ok` when `problems` is empty, otherwise the problems joined by `; `.
pub fn record(checks: &mut BTreeMap<String, String>, name: &str, problems: Vec<String>) {
    checks.insert(
        name.into(),
        if problems.is_empty() {
            OK.into()
        } else {
            problems.join("; ")
        },
    );
}

/// `Ok` when every check passed; otherwise `<provider> is not offered: ` and each failed
/// check as `name: why`.
pub fn availability(
    provider: &str,
    checks: &BTreeMap<String, String>,
) -> Result<(), crate::Withdrawn> {
    let failed: Vec<(String, String)> = checks
        .iter()
        .filter(|(_, v)| *v != OK)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if failed.is_empty() {
        Ok(())
    } else {
        Err(crate::Withdrawn::Checks {
            provider: provider.to_owned(),
            failed,
        })
    }
}

/// A file's identity: device, inode, size, modification and change times (s, ns). Any write
/// or replacement of the file changes it (the change time at least).
pub type FileIdentity = (u64, u64, u64, i64, i64, i64, i64);

/// The identity of the file `m` describes.
pub fn file_identity(m: &std::fs::Metadata) -> FileIdentity {
    use std::os::unix::fs::MetadataExt as _;
    (
        m.dev(),
        m.ino(),
        m.size(),
        m.mtime(),
        m.mtime_nsec(),
        m.ctime(),
        m.ctime_nsec(),
    )
}

/// The hex SHA-256 of a file; the error names the file.
pub fn sha256_file(path: &Path) -> Result<String, crate::ReadFileError> {
    sha256_file_identified(path).map(|(_, digest)| digest)
}

/// The identity of the file at `path` as it was opened, and the hex SHA-256 of what was read
/// through that same descriptor; the error names the file.
///
/// Probes name every binary they rely on by digest, at start-up and at every re-check, and
/// several providers name the same files (the agent, the probe, the trial runner: 10 to
/// 200 MB each). So a digest is remembered per path together with the file's identity
/// (device, inode, size, modification and change times, to the nanosecond) and computed
/// again only when any of those changed: any write or replacement changes the change time.
pub fn sha256_file_identified(path: &Path) -> Result<(FileIdentity, String), crate::ReadFileError> {
    use sha2::Digest as _;
    use std::collections::HashMap;
    use std::io::Read as _;
    use std::path::PathBuf;
    use std::sync::{Mutex, OnceLock};

    static KNOWN: OnceLock<Mutex<HashMap<PathBuf, (FileIdentity, String)>>> = OnceLock::new();
    let cannot = |io| crate::ReadFileError {
        path: path.to_owned(),
        io,
    };

    let mut f = std::fs::File::open(path).map_err(cannot)?;
    let identity = file_identity(&f.metadata().map_err(cannot)?);
    let known = KNOWN.get_or_init(Default::default);
    if let Some((seen, digest)) = known.lock().unwrap_or_else(|p| p.into_inner()).get(path)
        && *seen == identity
    {
        return Ok((identity, digest.clone()));
    }
    let mut h = sha2::Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(cannot)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    let digest = hex::encode(h.finalize());
    known
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(path.to_owned(), (identity, digest.clone()));
    Ok((identity, digest))
}

/// The probe ran as `expected` (uid, euid, gid) with no other group.
pub fn uid_problems(r: &ProbeReport, expected: u32) -> Vec<String> {
    let mut p = Vec::new();
    if r.uid != expected || r.euid != expected || r.gid != expected {
        p.push(format!(
            "runs as uid {} euid {} gid {}, expected {expected}",
            r.uid, r.euid, r.gid
        ));
    }
    if r.groups.iter().any(|g| *g != expected) {
        p.push(format!("supplementary groups {:?}", r.groups));
    }
    p
}

/// `/` is mounted read-only: `None`, or the problem.
pub fn root_read_only_problem(r: &ProbeReport) -> Option<String> {
    match r.mounts.get("/") {
        Some(m) if m == "ro" => None,
        other => Some(format!(
            "/ is mounted {}",
            other.map_or("?", String::as_str)
        )),
    }
}

/// Every host file the probe could read.
pub fn readable_host_files(r: &ProbeReport) -> Vec<String> {
    r.read_attempts
        .iter()
        .filter(|(_, o)| *o == "readable")
        .map(|(path, _)| format!("{path} is readable"))
        .collect()
}

/// Variables the probe saw beyond `allowed` (names only, never values).
pub fn environment_problems(r: &ProbeReport, allowed: &[&str]) -> Vec<String> {
    let extra: Vec<&String> = r
        .environment
        .iter()
        .filter(|n| !allowed.contains(&n.as_str()))
        .collect();
    if extra.is_empty() {
        vec![]
    } else {
        vec![format!("unexpected variables {extra:?}")]
    }
}

/// The host's kernel release (`uname -r`), to tell a sandbox's kernel from the host's.
pub fn host_kernel_release() -> String {
    rustix::system::uname()
        .release()
        .to_string_lossy()
        .into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_check_is_ok_or_its_problems_and_any_failure_withholds_the_provider() {
        let mut checks = BTreeMap::new();
        record(&mut checks, "uid", vec![]);
        assert_eq!(availability("crun", &checks), Ok(()));
        record(&mut checks, "network", vec!["a".into(), "b".into()]);
        assert_eq!(checks["uid"], "ok");
        assert_eq!(checks["network"], "a; b");
        let withdrawn = availability("crun", &checks).unwrap_err();
        assert_eq!(
            withdrawn,
            crate::Withdrawn::Checks {
                provider: "crun".into(),
                failed: vec![("network".into(), "a; b".into())],
            }
        );
        assert_eq!(withdrawn.to_string(), "crun is not offered: network: a; b");
    }

    #[test]
    fn the_shared_report_checks_name_each_breach() {
        let mut r = ProbeReport {
            uid: 7,
            euid: 7,
            gid: 7,
            environment: vec!["PATH".into()],
            ..ProbeReport::default()
        };
        r.mounts.insert("/".into(), "ro".into());
        r.read_attempts
            .insert("/etc/shadow".into(), "error: EACCES".into());
        assert!(uid_problems(&r, 7).is_empty());
        assert!(root_read_only_problem(&r).is_none());
        assert!(readable_host_files(&r).is_empty());
        assert!(environment_problems(&r, &["PATH"]).is_empty());

        r.groups.push(0);
        r.mounts.insert("/".into(), "rw".into());
        r.read_attempts.insert("/root/x".into(), "readable".into());
        r.environment.push("SECRET_NAME".into());
        assert_eq!(uid_problems(&r, 7), ["supplementary groups [0]"]);
        assert_eq!(
            root_read_only_problem(&r).as_deref(),
            Some("/ is mounted rw")
        );
        assert_eq!(readable_host_files(&r), ["/root/x is readable"]);
        assert_eq!(
            environment_problems(&r, &["PATH"]),
            [r#"unexpected variables ["SECRET_NAME"]"#]
        );
        assert_eq!(uid_problems(&r, 8).len(), 2);
    }

    #[test]
    fn a_file_hashes_to_its_sha256_and_a_missing_one_is_named() {
        let path = std::env::temp_dir().join(format!("plimsoll-evidence-{}", std::process::id()));
        std::fs::write(&path, b"abc").unwrap();
        let sha = sha256_file(&path);
        std::fs::remove_file(&path).unwrap();
        assert_eq!(
            sha.unwrap(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        let e = sha256_file(&path).unwrap_err();
        assert_eq!(e.path, path);
        assert_eq!(e.io.kind(), std::io::ErrorKind::NotFound);
        let e = e.to_string();
        assert!(e.contains(&path.display().to_string()), "{e}");
    }

    /// The remembered digest never outlives the file it was taken of: a rewrite of the same
    /// size, within the same second, is hashed again.
    #[test]
    fn a_rewritten_file_is_hashed_again() {
        let path = std::env::temp_dir().join(format!("plimsoll-rehash-{}", std::process::id()));
        std::fs::write(&path, b"abc").unwrap();
        let first = sha256_file(&path).unwrap();
        assert_eq!(sha256_file(&path).unwrap(), first, "remembered");
        std::fs::write(&path, b"abd").unwrap();
        let second = sha256_file(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_ne!(second, first);
        assert_eq!(
            second,
            "a52d159f262b2c6ddb724a61840befc36eb30c88877a4030b65cbe86298449c9"
        );
    }
}
