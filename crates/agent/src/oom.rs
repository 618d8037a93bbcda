//! The memory cgroup's count of OOM kills, read before and after each step: a step killed by
//! SIGKILL while the count went up was killed by the memory limit. Best effort: where no
//! counter can be read (no cgroup file system mounted, an old kernel), it is never reported.

use std::path::PathBuf;

/// The files that may hold the agent's memory cgroup's OOM-kill count, most specific first:
/// cgroup v2 `memory.events`, then cgroup v1 `memory.oom_control`, each at the agent's own
/// cgroup path (from /proc/self/cgroup) and at the mount's root (what a container sees).
fn candidates(proc_self_cgroup: &str) -> Vec<PathBuf> {
    let mut v2 = None;
    let mut v1 = None;
    for line in proc_self_cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        if id == "0" && controllers.is_empty() {
            v2 = Some(path.trim_start_matches('/').to_owned());
        } else if controllers.split(',').any(|c| c == "memory") {
            v1 = Some(path.trim_start_matches('/').to_owned());
        }
    }
    let mut out = Vec::new();
    let root = PathBuf::from("/sys/fs/cgroup");
    if let Some(p) = v2.filter(|p| !p.is_empty()) {
        out.push(root.join(p).join("memory.events"));
    }
    out.push(root.join("memory.events"));
    if let Some(p) = v1.filter(|p| !p.is_empty()) {
        out.push(root.join("memory").join(p).join("memory.oom_control"));
    }
    out.push(root.join("memory/memory.oom_control"));
    out
}

/// The `oom_kill N` line of a `memory.events` or `memory.oom_control` file.
fn parse_oom_kill(text: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let mut words = line.split_whitespace();
        (words.next() == Some("oom_kill"))
            .then(|| words.next()?.parse().ok())
            .flatten()
    })
}

/// Where the count is read, chosen once per job.
#[derive(Debug, Clone)]
pub struct OomCounter {
    file: Option<PathBuf>,
}

impl OomCounter {
    /// Finds the first readable counter, if any.
    pub fn find() -> Self {
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        let file = candidates(&own).into_iter().find(|f| {
            std::fs::read_to_string(f)
                .ok()
                .and_then(|t| parse_oom_kill(&t))
                .is_some()
        });
        OomCounter { file }
    }

    /// The count now, if it can be read.
    pub fn read(&self) -> Option<u64> {
        let text = std::fs::read_to_string(self.file.as_ref()?).ok()?;
        parse_oom_kill(&text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_count_in_both_formats() {
        let v2 = "low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\noom_group_kill 0\n";
        assert_eq!(parse_oom_kill(v2), Some(2));
        let v1 = "oom_kill_disable 0\nunder_oom 0\noom_kill 7\n";
        assert_eq!(parse_oom_kill(v1), Some(7));
        assert_eq!(parse_oom_kill("oom 1\n"), None);
    }

    #[test]
    fn candidate_files_follow_proc_self_cgroup() {
        let hybrid = "4:memory:/sandboxd/job1\n3:cpuset:/\n0::/\n";
        let c = candidates(hybrid);
        assert_eq!(
            c,
            [
                "/sys/fs/cgroup/memory.events",
                "/sys/fs/cgroup/memory/sandboxd/job1/memory.oom_control",
                "/sys/fs/cgroup/memory/memory.oom_control",
            ]
            .map(PathBuf::from)
        );
        let v2 = candidates("0::/user.slice/run-1.scope\n");
        assert_eq!(
            v2[0],
            PathBuf::from("/sys/fs/cgroup/user.slice/run-1.scope/memory.events")
        );
    }
}
