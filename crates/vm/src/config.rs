//! The VM provider's configuration, with its defaults.

use std::ops::Range;
use std::path::PathBuf;
use std::time::Duration;

/// Which accelerator the provider may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccelChoice {
    /// KVM when a probe guest boots under it, otherwise TCG (the tier says which).
    Auto,
    /// KVM only: the provider is withdrawn when KVM cannot run a guest.
    Kvm,
    /// TCG only (tier `kernel`).
    Tcg,
}

impl AccelChoice {
    /// The settings-file spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            AccelChoice::Auto => "auto",
            AccelChoice::Kvm => "kvm",
            AccelChoice::Tcg => "tcg",
        }
    }

    /// Parses `auto`, `kvm` or `tcg`.
    pub fn parse(s: &str) -> Result<Self, UnknownAccelerator> {
        match s {
            "auto" => Ok(AccelChoice::Auto),
            "kvm" => Ok(AccelChoice::Kvm),
            "tcg" => Ok(AccelChoice::Tcg),
            other => Err(UnknownAccelerator(other.to_owned())),
        }
    }
}

/// An accelerator setting that is none of `auto`, `kvm`, `tcg`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("accelerator `{0}` is not one of auto, kvm, tcg")]
pub struct UnknownAccelerator(pub String);

/// Where the VM provider finds what it boots, and where it keeps its files.
#[derive(Debug, Clone)]
pub struct VmConfig {
    /// The QEMU binary.
    pub qemu: PathBuf,
    /// The directory scripts/build-vm-assets fills (`vmlinux`, `initramfs.cpio.gz`,
    /// `disk.ext4`, `kernel-release`, `image-identity`, `manifest`).
    pub assets: PathBuf,
    /// `plimsoll-agent`, copied into each guest.
    pub agent: PathBuf,
    /// `plimsoll-probe`, copied into each guest.
    pub probe: PathBuf,
    /// `plimsoll-trial-runner`, copied into the guests of runs with a trial step (default:
    /// beside the agent).
    pub trial_runner: PathBuf,
    /// `plimsoll-guest-init` (this crate's binary), the guest's PID 1.
    pub guest_init: PathBuf,
    /// The daemon's state directory: runs live in `<state_dir>/runs/<run_id>` (the engine's
    /// `LaunchPlan::run_dir`), the provider's own files in `<state_dir>/qemu`.
    pub state_dir: PathBuf,
    /// The uid (and gid) of the startup probe's QEMU; never one a run holds.
    pub probe_uid: u32,
    /// The uids runs are given (the engine's `sandbox_uid_base .. + max_concurrent`): at
    /// construction, QEMU processes of these uids and of `probe_uid` are leftovers of a
    /// daemon that died, and are killed.
    pub run_uids: Range<u32>,
    /// Which accelerator.
    pub accelerator: AccelChoice,
    /// vCPUs per VM.
    pub cpus: u32,
    /// How long a guest may take to boot (QEMU start to the guest's hello) under TCG.
    pub boot_timeout: Duration,
    /// How long a guest may take to boot under KVM before KVM is judged unusable.
    pub kvm_boot_timeout: Duration,
}

impl VmConfig {
    /// Defaults: Debian's QEMU, `auto` accelerator, 2 vCPUs, a 30 s boot budget (5 s under
    /// KVM). The paths, the state directory and the uids must be given.
    pub fn new(
        assets: PathBuf,
        agent: PathBuf,
        probe: PathBuf,
        guest_init: PathBuf,
        state_dir: PathBuf,
        probe_uid: u32,
        run_uids: Range<u32>,
    ) -> Self {
        VmConfig {
            qemu: PathBuf::from("/usr/bin/qemu-system-x86_64"),
            assets,
            trial_runner: agent.with_file_name("plimsoll-trial-runner"),
            agent,
            probe,
            guest_init,
            state_dir,
            probe_uid,
            run_uids,
            accelerator: AccelChoice::Auto,
            cpus: 2,
            boot_timeout: Duration::from_secs(30),
            kvm_boot_timeout: Duration::from_secs(5),
        }
    }

    /// Where run directories live.
    pub fn runs_root(&self) -> PathBuf {
        self.state_dir.join("runs")
    }

    /// The provider's own files (the run initramfs).
    pub fn own_dir(&self) -> PathBuf {
        self.state_dir.join("qemu")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accelerator_names() {
        for c in [AccelChoice::Auto, AccelChoice::Kvm, AccelChoice::Tcg] {
            assert_eq!(AccelChoice::parse(c.as_str()).unwrap(), c);
        }
        assert!(AccelChoice::parse("hvf").is_err());
    }
}
