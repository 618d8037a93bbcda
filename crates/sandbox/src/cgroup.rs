//! The host's cgroup layout (v1, hybrid or v2), the per-run cgroup directories under the
//! provider's cgroup parent, their removal, and what the memory controller saw of a run.
//! Used by the OCI providers and by the process tier (its per-run memory cgroup).
//!
//! A run's container lives in `<parent>/<run_id>/ctr` (the runtime creates it from
//! `linux.cgroupsPath` and removes it); `<parent>/<run_id>` stays behind the runtime's back,
//! so the run's memory peak (v1) or OOM-kill count (v2, hierarchical) can be read after the
//! runtime has deleted the container. plimsoll removes `<parent>/<run_id>` itself, in every
//! hierarchy, after each run; `reap` removes what a killed daemon left.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// One mounted cgroup hierarchy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hierarchy {
    /// Where it is mounted.
    pub mount: PathBuf,
    /// Its controllers (`memory`, `cpu`, ...; `name=systemd` for a named v1 hierarchy;
    /// empty for cgroup2).
    pub controllers: Vec<String>,
    /// `true` for cgroup2.
    pub v2: bool,
}

/// How cgroups are mounted on this host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupMode {
    /// cgroup v1 only.
    V1,
    /// cgroup v1 with a cgroup2 mount beside it (systemd's "hybrid").
    Hybrid,
    /// cgroup v2 only (the unified hierarchy).
    V2,
    /// No cgroup file system is mounted.
    None,
}

impl CgroupMode {
    /// `v1`, `hybrid`, `v2` or `none`.
    pub fn as_str(self) -> &'static str {
        match self {
            CgroupMode::V1 => "v1",
            CgroupMode::Hybrid => "hybrid",
            CgroupMode::V2 => "v2",
            CgroupMode::None => "none",
        }
    }
}

/// Every cgroup hierarchy mounted in this mount namespace.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CgroupLayout {
    /// The hierarchies, in mountinfo order.
    pub hierarchies: Vec<Hierarchy>,
}

/// What the memory controller recorded for a run's cgroup.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemorySeen {
    /// The highest usage, bytes (v1 `memory.max_usage_in_bytes`, v2 `memory.peak`).
    pub peak_bytes: Option<u64>,
    /// OOM kills counted (v2 `memory.events`, hierarchical). v1 counts them only in the
    /// container's own cgroup, which the runtime has removed by then.
    pub oom_kills: Option<u64>,
}

impl MemorySeen {
    /// Whether the memory limit ended something: an OOM kill was counted, or (where kills
    /// are not counted) the usage reached the limit. `limit` in bytes.
    pub fn hit_limit(&self, limit: u64) -> bool {
        match (self.oom_kills, self.peak_bytes) {
            (Some(n), _) => n > 0,
            // Charges come in batches, so the peak stops a little short of the limit.
            (None, Some(peak)) => peak.saturating_add(PEAK_SLACK) >= limit,
            (None, None) => false,
        }
    }
}

impl MemorySeen {
    /// Whether the run reports `oom_killed`: the kernel killed one of its processes for memory
    /// (the leader or any other: a parent that outlives a killed child still says so), or,
    /// where kills are not counted, the leader died by SIGKILL with the usage at the limit.
    pub fn oom_killed(&self, limit: u64, leader_killed: bool) -> bool {
        match self.oom_kills {
            Some(n) => n > 0,
            None => leader_killed && self.hit_limit(limit),
        }
    }
}

/// How far below the limit a v1 peak may stop and still count as having reached it.
const PEAK_SLACK: u64 = 1024 * 1024;

/// A cgroup directory could not be removed.
#[derive(Debug, thiserror::Error)]
pub enum RemoveCgroupError {
    /// Reading or removing failed.
    #[error("cannot remove cgroup {path}")]
    Io {
        /// The directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// Processes stayed in it after SIGKILL.
    #[error("cgroup {path} still holds processes {pids:?} after SIGKILL; check them with ps")]
    Busy {
        /// The directory.
        path: PathBuf,
        /// What was left.
        pids: Vec<i32>,
    },
}

impl CgroupLayout {
    /// The layout of this process's mount namespace.
    pub fn detect() -> io::Result<CgroupLayout> {
        Ok(CgroupLayout::parse(&fs::read_to_string(
            "/proc/self/mountinfo",
        )?))
    }

    /// Parses /proc/self/mountinfo text.
    pub fn parse(mountinfo: &str) -> CgroupLayout {
        let mut hierarchies = Vec::new();
        for line in mountinfo.lines() {
            let fields: Vec<&str> = line.split(' ').collect();
            let Some(sep) = fields.iter().position(|f| *f == "-") else {
                continue;
            };
            let (Some(mount), Some(fstype), Some(superopts)) =
                (fields.get(4), fields.get(sep + 1), fields.get(sep + 3))
            else {
                continue;
            };
            let v2 = match *fstype {
                "cgroup2" => true,
                "cgroup" => false,
                _ => continue,
            };
            let controllers = if v2 {
                Vec::new()
            } else {
                superopts
                    .split(',')
                    .filter(|o| {
                        !matches!(
                            *o,
                            "rw" | "ro"
                                | "relatime"
                                | "noexec"
                                | "nosuid"
                                | "nodev"
                                | "clone_children"
                        ) && !o.starts_with("release_agent=")
                    })
                    .map(str::to_owned)
                    .collect()
            };
            hierarchies.push(Hierarchy {
                mount: PathBuf::from(unescape(mount)),
                controllers,
                v2,
            });
        }
        CgroupLayout { hierarchies }
    }

    /// v1, hybrid, v2 or none.
    pub fn mode(&self) -> CgroupMode {
        let v1 = self.hierarchies.iter().any(|h| !h.v2);
        let v2 = self.hierarchies.iter().any(|h| h.v2);
        match (v1, v2) {
            (true, true) => CgroupMode::Hybrid,
            (true, false) => CgroupMode::V1,
            (false, true) => CgroupMode::V2,
            (false, false) => CgroupMode::None,
        }
    }

    /// The cgroup2 mount crun refuses to run beside (hybrid mode with controllers enabled
    /// in cgroup2): crun runs in a mount namespace without it.
    pub fn crun_must_hide(&self) -> Option<&Path> {
        if self.mode() != CgroupMode::Hybrid {
            return None;
        }
        self.hierarchies
            .iter()
            .filter(|h| h.v2)
            .find(|h| {
                fs::read_to_string(h.mount.join("cgroup.controllers"))
                    .is_ok_and(|c| !c.trim().is_empty())
            })
            .map(|h| h.mount.as_path())
    }

    /// The memory and pids limits of the cgroups a process is in, given its /proc/PID/cgroup
    /// text (read from this mount namespace, so its paths are this host's): v1's
    /// `memory.limit_in_bytes` and `pids.max`, or v2's `memory.max` and `pids.max`. A limit
    /// of `max`, v1's "unlimited" (2^63 rounded down to a page), or one not readable, is `None`.
    pub fn limits_of(&self, proc_cgroup: &str) -> (Option<u64>, Option<u64>) {
        let mut memory = None;
        let mut pids = None;
        let read = |dir: PathBuf, file: &str| -> Option<u64> {
            let v: u64 = fs::read_to_string(dir.join(file))
                .ok()?
                .trim()
                .parse()
                .ok()?;
            (v < 1 << 62).then_some(v)
        };
        for line in proc_cgroup.lines() {
            let mut f = line.splitn(3, ':');
            let (Some(_), Some(controllers), Some(path)) = (f.next(), f.next(), f.next()) else {
                continue;
            };
            let rel = path.trim_start_matches('/');
            if controllers.is_empty() {
                for h in self.hierarchies.iter().filter(|h| h.v2) {
                    let dir = h.mount.join(rel);
                    memory = memory.or_else(|| read(dir.clone(), "memory.max"));
                    pids = pids.or_else(|| read(dir, "pids.max"));
                }
                continue;
            }
            for c in controllers.split(',') {
                let Some(h) = self
                    .hierarchies
                    .iter()
                    .find(|h| !h.v2 && h.controllers.iter().any(|x| x == c))
                else {
                    continue;
                };
                match c {
                    "memory" => memory = read(h.mount.join(rel), "memory.limit_in_bytes"),
                    "pids" => pids = read(h.mount.join(rel), "pids.max"),
                    _ => {}
                }
            }
        }
        (memory, pids)
    }

    /// Whether a memory controller is mounted (v1 `memory`, or v2 with `memory` available).
    pub fn has_memory(&self) -> bool {
        self.memory_hierarchy().is_some()
    }

    /// The hierarchy holding the memory controller: cgroup v1's `memory`, else a cgroup2
    /// mount whose `cgroup.controllers` lists `memory`.
    pub fn memory_hierarchy(&self) -> Option<&Hierarchy> {
        self.hierarchies
            .iter()
            .find(|h| !h.v2 && h.controllers.iter().any(|c| c == "memory"))
            .or_else(|| {
                self.hierarchies.iter().find(|h| {
                    h.v2 && fs::read_to_string(h.mount.join("cgroup.controllers"))
                        .is_ok_and(|c| c.split_whitespace().any(|x| x == "memory"))
                })
            })
    }

    /// `rel` (a cgroup path such as `/plimsoll/crun/<run_id>`) in every hierarchy, one
    /// directory per distinct mount.
    pub fn dirs(&self, rel: &str) -> Vec<PathBuf> {
        let rel = rel.trim_start_matches('/');
        let mut out: Vec<PathBuf> = Vec::new();
        for h in &self.hierarchies {
            let d = h.mount.join(rel);
            if !out.contains(&d) {
                out.push(d);
            }
        }
        out
    }

    /// What the memory controller recorded for cgroup `rel` (and everything below it).
    pub fn memory_seen(&self, rel: &str) -> MemorySeen {
        let Some(h) = self.memory_hierarchy() else {
            return MemorySeen::default();
        };
        let dir = h.mount.join(rel.trim_start_matches('/'));
        let read_u64 = |f: &str| {
            fs::read_to_string(dir.join(f))
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
        };
        if h.v2 {
            MemorySeen {
                peak_bytes: read_u64("memory.peak"),
                oom_kills: oom_kills_in(&dir, true),
            }
        } else {
            MemorySeen {
                peak_bytes: read_u64("memory.max_usage_in_bytes"),
                oom_kills: None,
            }
        }
    }

    /// The OOM kills counted in the memory cgroup at `rel` itself (`None` where it has no
    /// count or is gone). On v1 a run's kills are counted only in the innermost cgroup, so a
    /// caller reads it there before the runtime removes it.
    pub fn oom_kills(&self, rel: &str) -> Option<u64> {
        let h = self.memory_hierarchy()?;
        oom_kills_in(&h.mount.join(rel.trim_start_matches('/')), h.v2)
    }

    /// Names of the cgroup directories directly below `rel`, over every hierarchy.
    pub fn children(&self, rel: &str) -> Vec<String> {
        let mut names = Vec::new();
        for dir in self.dirs(rel) {
            let Ok(entries) = fs::read_dir(&dir) else {
                continue;
            };
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    let n = e.file_name().to_string_lossy().into_owned();
                    if !names.contains(&n) {
                        names.push(n);
                    }
                }
            }
        }
        names.sort();
        names
    }

    /// Removes cgroup `rel` and everything below it in every hierarchy, killing what is
    /// still inside. A directory that does not exist is fine.
    pub fn remove(&self, rel: &str) -> Result<usize, RemoveCgroupError> {
        let mut removed = 0;
        let mut first_err = None;
        for dir in self.dirs(rel) {
            match remove_tree(&dir) {
                Ok(n) => removed += n,
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(removed),
        }
    }
}

/// The OOM kills the memory controller counted in the cgroup at `dir`: v2's `memory.events`
/// (hierarchical), v1's `memory.oom_control` (that cgroup's own).
pub fn oom_kills_in(dir: &Path, v2: bool) -> Option<u64> {
    let file = if v2 {
        "memory.events"
    } else {
        "memory.oom_control"
    };
    fs::read_to_string(dir.join(file)).ok().and_then(|t| {
        t.lines()
            .find_map(|l| l.strip_prefix("oom_kill "))
            .and_then(|v| v.trim().parse().ok())
    })
}

/// Mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Removes one cgroup directory tree, deepest first. Returns how many were removed.
fn remove_tree(dir: &Path) -> Result<usize, RemoveCgroupError> {
    let io_err = |source| RemoveCgroupError::Io {
        path: dir.to_owned(),
        source,
    };
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(io_err(e)),
    };
    let mut removed = 0;
    for e in entries.flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            removed += remove_tree(&e.path())?;
        }
    }
    empty_cgroup(dir)?;
    match fs::remove_dir(dir) {
        Ok(()) => Ok(removed + 1),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(removed),
        Err(e) => Err(io_err(e)),
    }
}

/// Kills every process in one cgroup (thawing it first) and waits until it is empty.
fn empty_cgroup(dir: &Path) -> Result<(), RemoveCgroupError> {
    let procs = || -> Vec<i32> {
        fs::read_to_string(dir.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    };
    if procs().is_empty() {
        return Ok(());
    }
    // A frozen task does not die of SIGKILL until it is thawed.
    let _ = fs::write(dir.join("freezer.state"), "THAWED");
    let _ = fs::write(dir.join("cgroup.freeze"), "0");
    let start = Instant::now();
    loop {
        let left = procs();
        if left.is_empty() {
            return Ok(());
        }
        if start.elapsed() > Duration::from_secs(5) {
            return Err(RemoveCgroupError::Busy {
                path: dir.to_owned(),
                pids: left,
            });
        }
        if fs::write(dir.join("cgroup.kill"), "1").is_err() {
            for pid in &left {
                if let Some(p) = rustix::process::Pid::from_raw(*pid) {
                    let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
                }
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
25 1 0:23 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
30 25 0:26 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
31 30 0:27 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
32 30 0:28 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
33 30 0:29 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
34 30 0:30 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
35 30 0:31 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    /// A process's limits are read from the cgroups /proc/PID/cgroup names, in the hierarchy
    /// of each controller; `max` and v1's "unlimited" are no limit.
    #[test]
    fn a_process_limits_are_read_from_its_own_cgroups() {
        let root = plimsoll_testing::TestDir::new("cgroup", "limits");
        let h = |name: &str, controllers: &[&str], v2: bool| Hierarchy {
            mount: root.path().join(name),
            controllers: controllers.iter().map(|c| (*c).to_owned()).collect(),
            v2,
        };
        let layout = CgroupLayout {
            hierarchies: vec![
                h("memory", &["memory"], false),
                h("pids", &["pids"], false),
                h("unified", &[], true),
            ],
        };
        let write = |path: &str, v: &str| {
            let p = root.path().join(path);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(p, v).unwrap();
        };
        write("memory/run/ctr/memory.limit_in_bytes", "268435456\n");
        write("pids/run/ctr/pids.max", "64\n");
        write(
            "memory/other/memory.limit_in_bytes",
            "9223372036854771712\n",
        );
        write("pids/other/pids.max", "max\n");
        let seen = "12:pids:/run/ctr\n9:memory:/run/ctr\n1:name=systemd:/x\n0::/run/ctr\n";
        assert_eq!(layout.limits_of(seen), (Some(256 << 20), Some(64)));
        let unlimited = "12:pids:/other\n9:memory:/other\n";
        assert_eq!(layout.limits_of(unlimited), (None, None));
        write("unified/v2/memory.max", "1048576\n");
        write("unified/v2/pids.max", "max\n");
        let v2 = CgroupLayout {
            hierarchies: vec![h("unified", &[], true)],
        };
        assert_eq!(v2.limits_of("0::/v2\n"), (Some(1 << 20), None));
    }

    #[test]
    fn parses_a_hybrid_layout() {
        let l = CgroupLayout::parse(HYBRID);
        assert_eq!(l.mode(), CgroupMode::Hybrid);
        assert_eq!(l.hierarchies.len(), 5);
        assert_eq!(l.hierarchies[1].controllers, ["memory"]);
        assert_eq!(l.hierarchies[3].controllers, ["name=systemd"]);
        assert!(l.hierarchies[4].v2);
        let dirs = l.dirs("/plimsoll/crun/abc");
        assert_eq!(dirs.len(), 5);
        assert_eq!(
            dirs[1],
            Path::new("/sys/fs/cgroup/memory/plimsoll/crun/abc")
        );
        assert_eq!(
            dirs[4],
            Path::new("/sys/fs/cgroup/unified/plimsoll/crun/abc")
        );
    }

    #[test]
    fn parses_v1_and_v2_only() {
        let v2 = "40 25 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n";
        let l = CgroupLayout::parse(v2);
        assert_eq!(l.mode(), CgroupMode::V2);
        assert_eq!(l.crun_must_hide(), None);
        assert_eq!(
            l.dirs("plimsoll/x"),
            [PathBuf::from("/sys/fs/cgroup/plimsoll/x")]
        );
        let v1: String = HYBRID
            .lines()
            .filter(|l| !l.contains("cgroup2"))
            .map(|l| format!("{l}\n"))
            .collect();
        assert_eq!(CgroupLayout::parse(&v1).mode(), CgroupMode::V1);
        assert_eq!(CgroupLayout::parse("").mode(), CgroupMode::None);
    }

    #[test]
    fn co_mounted_controllers_are_one_directory() {
        let text = "31 30 0:27 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n";
        let l = CgroupLayout::parse(text);
        assert_eq!(l.hierarchies[0].controllers, ["cpu", "cpuacct"]);
        assert_eq!(l.dirs("/a").len(), 1);
    }

    #[test]
    fn a_counted_kill_of_any_process_is_oom_killed_and_a_peak_only_with_a_killed_leader() {
        let limit = 256 << 20;
        let seen = |peak_bytes, oom_kills| MemorySeen {
            peak_bytes,
            oom_kills,
        };
        // A child killed, the leader alive: counted, so reported.
        assert!(seen(Some(limit), Some(2)).oom_killed(limit, false));
        assert!(!seen(Some(limit), Some(0)).oom_killed(limit, true));
        // Without a count, the peak says so only when the leader died by SIGKILL.
        assert!(seen(Some(limit), None).oom_killed(limit, true));
        assert!(!seen(Some(limit), None).oom_killed(limit, false));
        assert!(!seen(Some(limit / 2), None).oom_killed(limit, true));
    }

    #[test]
    fn the_limit_counts_as_hit_by_kills_or_by_the_peak() {
        let limit = 256 << 20;
        assert!(
            MemorySeen {
                peak_bytes: Some(limit),
                oom_kills: None
            }
            .hit_limit(limit)
        );
        assert!(
            MemorySeen {
                peak_bytes: Some(limit - 4096),
                oom_kills: None
            }
            .hit_limit(limit)
        );
        assert!(
            !MemorySeen {
                peak_bytes: Some(limit / 2),
                oom_kills: None
            }
            .hit_limit(limit)
        );
        assert!(
            !MemorySeen {
                peak_bytes: Some(limit),
                oom_kills: Some(0)
            }
            .hit_limit(limit)
        );
        assert!(
            MemorySeen {
                peak_bytes: None,
                oom_kills: Some(1)
            }
            .hit_limit(limit)
        );
        assert!(!MemorySeen::default().hit_limit(limit));
    }

    #[test]
    fn removing_a_missing_cgroup_is_fine() {
        let l = CgroupLayout::parse(HYBRID);
        assert_eq!(l.remove("/plimsoll-test-does-not-exist/x").unwrap(), 0);
    }
}
