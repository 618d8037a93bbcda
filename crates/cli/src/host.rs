//! What this host offers: every provider probed (with progress on stderr), and the host
//! facts behind each missing tier (KVM, runtime binaries, the image, VM assets, cgroups).
//! Shared by `plimsoll init` and `plimsoll doctor`.

use std::path::{Path, PathBuf};
use std::time::Instant;

use plimsoll_engine::settings::{
    PROVIDER_NAMES, Settings, default_image_dir, default_vm_assets_dir,
};
use plimsoll_wire::{ProviderInfo, Tier};

use crate::Failure;
use crate::local::embedded_engine;

/// A reason on one line (`no reason given` when there is none), for a listing.
pub fn one_line(s: Option<&str>) -> String {
    s.unwrap_or("no reason given")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// Probes the providers `names` under `settings` (its own `providers` list is replaced) and
/// returns what each probe found, in `names` order. Probing runs real sandboxes, so it
/// says on stderr what it is doing and how long it took.
pub fn probe(settings: &Settings, names: &[String]) -> Result<Vec<ProviderInfo>, Failure> {
    let mut s = settings.clone();
    s.providers = Some(names.to_vec());
    crate::note(&format!(
        "probing {} provider(s) ({}): each runs the probe inside its wall; a VM under TCG takes \
         about 15 s",
        names.len(),
        names.join(", ")
    ));
    let started = Instant::now();
    let engine = embedded_engine(&s)?;
    let mut found = engine.providers();
    found.sort_by_key(|p| names.iter().position(|n| *n == p.name));
    let offered: Vec<&str> = found
        .iter()
        .filter(|p| p.available)
        .map(|p| p.name.as_str())
        .collect();
    crate::note(&format!(
        "probed in {:.1} s: {} offered{}",
        started.elapsed().as_secs_f64(),
        offered.len(),
        if offered.is_empty() {
            String::new()
        } else {
            format!(" ({})", offered.join(", "))
        }
    ));
    Ok(found)
}

/// Every provider name this build has.
pub fn all_providers() -> Vec<String> {
    PROVIDER_NAMES.iter().map(|s| (*s).to_owned()).collect()
}

/// The sandbox image directory the settings name, else the engine's default.
pub fn image_dir(settings: &Settings) -> PathBuf {
    settings.oci.image.clone().unwrap_or_else(default_image_dir)
}

/// The VM assets directory the settings name, else the engine's default.
pub fn vm_assets_dir(settings: &Settings) -> PathBuf {
    settings
        .qemu
        .assets
        .clone()
        .unwrap_or_else(default_vm_assets_dir)
}

/// The host's cgroup layout, from /proc/self/mountinfo.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupLayout {
    /// cgroup v2 mounted at /sys/fs/cgroup.
    Unified,
    /// cgroup v1 controllers, plus a cgroup2 mount at /sys/fs/cgroup/unified.
    Hybrid,
    /// cgroup v1 only.
    Legacy,
    /// No cgroup mount found.
    None,
}

impl CgroupLayout {
    /// Reads the layout of this host.
    pub fn detect() -> CgroupLayout {
        let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        Self::from_mountinfo(&text)
    }

    /// The layout described by the text of a mountinfo file, as the providers read it
    /// (plimsoll_sandbox::cgroup).
    pub fn from_mountinfo(text: &str) -> CgroupLayout {
        use plimsoll_sandbox::cgroup::{CgroupLayout as Mounted, CgroupMode};
        match Mounted::parse(text).mode() {
            CgroupMode::V2 => CgroupLayout::Unified,
            CgroupMode::Hybrid => CgroupLayout::Hybrid,
            CgroupMode::V1 => CgroupLayout::Legacy,
            CgroupMode::None => CgroupLayout::None,
        }
    }

    /// Its name in JSON and prose.
    pub fn name(self) -> &'static str {
        match self {
            CgroupLayout::Unified => "unified",
            CgroupLayout::Hybrid => "hybrid",
            CgroupLayout::Legacy => "legacy",
            CgroupLayout::None => "none",
        }
    }

    /// What the container tier makes of it, in plain words.
    pub fn meaning(self) -> &'static str {
        match self {
            CgroupLayout::Unified => "cgroup v2 at /sys/fs/cgroup: crun and runc both use it",
            CgroupLayout::Hybrid => {
                "cgroup v1 controllers plus a cgroup2 mount under /sys/fs/cgroup: runc uses v1; \
                 crun refuses the hybrid layout, so plimsoll runs it in a mount namespace \
                 without the cgroup2 mount"
            }
            CgroupLayout::Legacy => "cgroup v1 only: crun and runc use the v1 controllers",
            CgroupLayout::None => {
                "no cgroup file system is mounted: the container tier cannot set memory, pids \
                 or CPU limits; mount cgroup2 at /sys/fs/cgroup (boot with systemd, or \
                 `mount -t cgroup2 none /sys/fs/cgroup`)"
            }
        }
    }
}

/// What /dev/kvm looks like.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kvm {
    /// No /dev/kvm.
    Absent,
    /// /dev/kvm exists but cannot be opened read-write.
    NotOpenable(String),
    /// /dev/kvm opens.
    Present,
}

impl Kvm {
    /// Looks at /dev/kvm.
    pub fn detect() -> Kvm {
        let path = Path::new("/dev/kvm");
        if !path.exists() {
            return Kvm::Absent;
        }
        match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
        {
            Ok(_) => Kvm::Present,
            Err(e) => Kvm::NotOpenable(e.to_string()),
        }
    }

    /// Its state in JSON.
    pub fn name(&self) -> &'static str {
        match self {
            Kvm::Absent => "absent",
            Kvm::NotOpenable(_) => "not_openable",
            Kvm::Present => "present",
        }
    }
}

/// The Debian package that provides a provider's runtime binary, and the binary's path
/// under `settings`.
pub fn runtime_binary(settings: &Settings, provider: &str) -> Option<(PathBuf, &'static str)> {
    let oci = &settings.oci;
    match provider {
        "crun" => Some((
            oci.crun.clone().unwrap_or_else(|| "/usr/bin/crun".into()),
            "crun",
        )),
        "runc" => Some((
            oci.runc.clone().unwrap_or_else(|| "/usr/sbin/runc".into()),
            "runc",
        )),
        "runsc" => Some((
            oci.runsc.clone().unwrap_or_else(|| "/usr/bin/runsc".into()),
            "runsc",
        )),
        "qemu" => Some((
            settings
                .qemu
                .qemu
                .clone()
                .unwrap_or_else(|| "/usr/bin/qemu-system-x86_64".into()),
            "qemu-system-x86",
        )),
        "process" => None,
        _ => None,
    }
}

/// The tiers a provider can be offered at on some host (qemu: `kernel` under TCG, `vm`
/// under KVM).
pub fn reaches(provider: &str) -> &'static [Tier] {
    match provider {
        "process" => &[Tier::Process],
        "crun" | "runc" => &[Tier::Container],
        "runsc" => &[Tier::Kernel],
        "qemu" => &[Tier::Kernel, Tier::Vm],
        _ => &[],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_cgroup_layout_from_mountinfo() {
        let hybrid = "\
30 23 0:26 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
31 30 0:27 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw,nsdelegate
32 30 0:28 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
";
        assert_eq!(CgroupLayout::from_mountinfo(hybrid), CgroupLayout::Hybrid);
        let unified = "30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw\n";
        assert_eq!(CgroupLayout::from_mountinfo(unified), CgroupLayout::Unified);
        let legacy = "32 30 0:28 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids\n";
        assert_eq!(CgroupLayout::from_mountinfo(legacy), CgroupLayout::Legacy);
        assert_eq!(CgroupLayout::from_mountinfo(""), CgroupLayout::None);
    }
}
