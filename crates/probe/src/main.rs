//! The probe: run inside a sandbox, prints one `ProbeReport` as JSON on stdout.
//!
//! It reports what it sees and judges nothing (the provider does). It never panics on a
//! missing or unreadable file: the error text goes in the report instead. It runs in every
//! tier (a hardened process, a container, gVisor, a VM), so it needs only the kernel.
//!
//! Usage: `plimsoll-probe [--try-write PATH]... [--try-read PATH]...`

use std::collections::BTreeMap;
use std::fs;
use std::io::{Read as _, Write as _};
use std::path::Path;

use plimsoll_wire::{NamespaceSeen, ProbeReport};
use rustix::process::Resource;

/// Directories every probe tries to create a file in, besides `--try-write` paths.
const WRITE_TARGETS: &[&str] = &["/tmp", "/", "/etc", "/usr", "/var/tmp", "/dev/shm"];
/// Files every probe tries to read, besides `--try-read` paths.
const READ_TARGETS: &[&str] = &["/etc/shadow"];

fn main() {
    let mut try_write: Vec<String> = Vec::new();
    let mut try_read: Vec<String> = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let list = match arg.as_str() {
            "--try-write" => &mut try_write,
            "--try-read" => &mut try_read,
            "-h" | "--help" => {
                println!(
                    "plimsoll-probe [--try-write PATH]... [--try-read PATH]...\n\
                     Prints what this process sees (uid, capabilities, namespaces, mounts, \
                     writable paths, sockets, limits) as one JSON object."
                );
                return;
            }
            other => {
                eprintln!("plimsoll-probe: unknown argument `{other}`; see --help");
                std::process::exit(2);
            }
        };
        match args.next() {
            Some(path) => list.push(path),
            None => {
                eprintln!("plimsoll-probe: `{arg}` needs a path");
                std::process::exit(2);
            }
        }
    }
    let report = probe(&try_write, &try_read);
    let json = serde_json::to_string(&report).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"));
    let mut out = std::io::stdout().lock();
    // A closed stdout leaves nobody to tell.
    let _ = writeln!(out, "{json}");
}

fn probe(try_write: &[String], try_read: &[String]) -> ProbeReport {
    let status = fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| -> Option<String> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .map(|v| v.trim().to_owned())
    };
    let mut capabilities = BTreeMap::new();
    for set in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        let value = field(set).unwrap_or_else(|| "error: not in /proc/self/status".into());
        capabilities.insert(set.to_owned(), value);
    }
    let cwd = std::env::current_dir()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|e| format!("error: {e}"));

    let mut write_attempts = BTreeMap::new();
    let mut write_paths: Vec<String> = vec![cwd.clone()];
    write_paths.extend(WRITE_TARGETS.iter().map(|s| (*s).to_owned()));
    write_paths.extend(try_write.iter().cloned());
    for path in write_paths {
        let outcome = try_write_in(Path::new(&path));
        write_attempts.insert(path, outcome);
    }
    let mut read_attempts = BTreeMap::new();
    for path in READ_TARGETS
        .iter()
        .map(|s| (*s).to_owned())
        .chain(try_read.iter().cloned())
    {
        let outcome = try_read_file(Path::new(&path));
        read_attempts.insert(path, outcome);
    }

    let uname = rustix::system::uname();
    ProbeReport {
        uid: rustix::process::getuid().as_raw(),
        euid: rustix::process::geteuid().as_raw(),
        gid: rustix::process::getgid().as_raw(),
        groups: rustix::process::getgroups()
            .map(|g| g.iter().map(|g| g.as_raw()).collect())
            .unwrap_or_default(),
        capabilities,
        no_new_privs: field("NoNewPrivs").is_some_and(|v| v == "1"),
        seccomp_mode: field("Seccomp").and_then(|v| v.parse().ok()).unwrap_or(0),
        environment: env_names(),
        cwd,
        namespaces: namespaces(),
        mounts: mounts(),
        write_attempts,
        read_attempts,
        network_interfaces: network_interfaces(),
        socket_attempts: socket_attempts(),
        limits: limits(),
        kernel_release: uname.release().to_string_lossy().into_owned(),
        hostname: uname.nodename().to_string_lossy().into_owned(),
    }
}

/// The names of the environment variables we were given, sorted.
fn env_names() -> Vec<String> {
    let mut names: Vec<String> = std::env::vars_os()
        .map(|(k, _)| k.to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// `writable`, or the error, for creating (then removing) a file in a directory; for an
/// existing file, for opening it to append.
fn try_write_in(path: &Path) -> String {
    let result = if path.is_dir() {
        let file = path.join(format!(".plimsoll-probe-{}", std::process::id()));
        fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&file)
            .map(|_| {
                let _ = fs::remove_file(&file);
            })
    } else {
        fs::OpenOptions::new().append(true).open(path).map(|_| ())
    };
    match result {
        Ok(()) => "writable".into(),
        Err(e) => format!("error: {e}"),
    }
}

/// `readable`, or the error, for reading one byte.
fn try_read_file(path: &Path) -> String {
    let result = fs::File::open(path).and_then(|mut f| f.read(&mut [0u8; 1]));
    match result {
        Ok(_) => "readable".into(),
        Err(e) => format!("error: {e}"),
    }
}

fn namespaces() -> BTreeMap<String, NamespaceSeen> {
    let mut out = BTreeMap::new();
    match fs::read_dir("/proc/self/ns") {
        Ok(dir) => {
            for entry in dir.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                let id = fs::read_link(entry.path())
                    .map(|t| t.display().to_string())
                    .unwrap_or_else(|e| format!("error: {e}"));
                out.insert(
                    name,
                    NamespaceSeen {
                        id,
                        same_as_host: None,
                    },
                );
            }
        }
        Err(e) => {
            out.insert(
                "error".into(),
                NamespaceSeen {
                    id: format!("error: cannot list /proc/self/ns: {e}"),
                    same_as_host: None,
                },
            );
        }
    }
    out
}

/// Mount point -> `ro` or `rw`, from /proc/self/mountinfo (the last mount on a point wins,
/// as it is the one on top).
fn mounts() -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    match fs::read_to_string("/proc/self/mountinfo") {
        Ok(text) => {
            for line in text.lines() {
                let fields: Vec<&str> = line.split(' ').collect();
                let (Some(point), Some(options)) = (fields.get(4), fields.get(5)) else {
                    continue;
                };
                let ro = options.split(',').any(|o| o == "ro");
                out.insert(
                    unescape_mount(point),
                    if ro { "ro" } else { "rw" }.to_owned(),
                );
            }
        }
        Err(e) => {
            out.insert("error".into(), format!("error: /proc/self/mountinfo: {e}"));
        }
    }
    out
}

/// Mountinfo escapes space, tab, newline and backslash as `\ooo` octal.
fn unescape_mount(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && bytes[i + 1..i + 4]
                .iter()
                .all(|b| (b'0'..=b'7').contains(b))
        {
            let v = (bytes[i + 1] - b'0') * 64 + (bytes[i + 2] - b'0') * 8 + (bytes[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Interface names from /sys/class/net, else from /proc/net/dev; one `error: ...` entry
/// (a name no interface can have: it holds a colon) when neither can be read.
fn network_interfaces() -> Vec<String> {
    let sys_err = match fs::read_dir("/sys/class/net") {
        Ok(dir) => {
            let mut names: Vec<String> = dir
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect();
            names.sort();
            return names;
        }
        Err(e) => e,
    };
    match fs::read_to_string("/proc/net/dev") {
        Ok(text) => text
            .lines()
            .skip(2)
            .filter_map(|l| l.split(':').next())
            .map(|n| n.trim().to_owned())
            .filter(|n| !n.is_empty())
            .collect(),
        Err(e) => vec![format!(
            "error: /sys/class/net: {sys_err}; /proc/net/dev: {e}"
        )],
    }
}

fn socket_attempts() -> BTreeMap<String, String> {
    use rustix::net::{AddressFamily, SocketType, socket};
    let mut out = BTreeMap::new();
    for (name, family) in [
        ("AF_INET", AddressFamily::INET),
        ("AF_INET6", AddressFamily::INET6),
        ("AF_UNIX", AddressFamily::UNIX),
    ] {
        let outcome = match socket(family, SocketType::STREAM, None) {
            Ok(_fd) => "allowed".to_owned(),
            Err(e) => format!("error: {}", std::io::Error::from(e)),
        };
        out.insert(name.to_owned(), outcome);
    }
    out
}

fn limits() -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (name, resource) in [
        ("RLIMIT_AS", Resource::As),
        ("RLIMIT_CPU", Resource::Cpu),
        ("RLIMIT_NOFILE", Resource::Nofile),
        ("RLIMIT_NPROC", Resource::Nproc),
        ("RLIMIT_FSIZE", Resource::Fsize),
        ("RLIMIT_CORE", Resource::Core),
    ] {
        let soft = rustix::process::getrlimit(resource).current;
        out.insert(
            name.to_owned(),
            soft.map_or_else(|| "unlimited".to_owned(), |v| v.to_string()),
        );
    }
    cgroup_limits(&mut out);
    out
}

/// Memory and pids limits of our cgroup, v1 and v2, where the files can be read.
fn cgroup_limits(out: &mut BTreeMap<String, String>) {
    let text = match fs::read_to_string("/proc/self/cgroup") {
        Ok(t) => t,
        Err(e) => {
            out.insert("cgroup".into(), format!("error: /proc/self/cgroup: {e}"));
            return;
        }
    };
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_id), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let path = path.trim_start_matches('/');
        let files: Vec<(String, String)> = if controllers.is_empty() {
            ["memory.max", "pids.max"]
                .iter()
                .map(|f| {
                    (
                        format!("cgroup_v2.{f}"),
                        format!("/sys/fs/cgroup/{path}/{f}"),
                    )
                })
                .collect()
        } else {
            let mut v = Vec::new();
            for c in controllers.split(',') {
                let file = match c {
                    "memory" => "memory.limit_in_bytes",
                    "pids" => "pids.max",
                    _ => continue,
                };
                v.push((
                    format!("cgroup_v1.{file}"),
                    format!("/sys/fs/cgroup/{c}/{path}/{file}"),
                ));
            }
            v
        };
        for (key, file) in files {
            let value = fs::read_to_string(&file)
                .map(|v| v.trim().to_owned())
                .unwrap_or_else(|e| format!("error: {file}: {e}"));
            out.insert(key, value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unescapes_mount_points() {
        assert_eq!(unescape_mount(r"/a\040b"), "/a b");
        assert_eq!(unescape_mount(r"/plain"), "/plain");
        assert_eq!(unescape_mount(r"/trail\04"), r"/trail\04");
    }

    #[test]
    fn missing_files_are_reported_not_fatal() {
        let r = try_read_file(Path::new("/nonexistent/plimsoll"));
        assert!(r.starts_with("error: "), "{r}");
        let w = try_write_in(Path::new("/nonexistent/plimsoll"));
        assert!(w.starts_with("error: "), "{w}");
    }
}
