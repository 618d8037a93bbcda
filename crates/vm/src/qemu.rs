//! QEMU's command line and the guest kernel's, as pure functions of what was decided (so a
//! test and the docs can check them), and the host facts they need.

use crate::jail::inside;
use crate::tier::Accelerator;

/// QEMU's `-sandbox` option: its seccomp filter, with every optional denial on.
pub const SANDBOX: &str = "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny";
/// The machine: microvm (no PCI, no firmware tables beyond ACPI), with a PIT so TCG boots.
pub const MACHINE: &str = "microvm,pit=on";
/// The guest's translation-block cache under TCG, MiB (QEMU's default is 1 GiB of address
/// space, which would dominate `RLIMIT_AS`).
pub const TCG_TB_MIB: u64 = 256;

/// What one QEMU process is started with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QemuShape {
    /// The accelerator asked for (the only one on the command line: no silent fallback).
    pub accelerator: Accelerator,
    /// vCPUs.
    pub cpus: u32,
    /// Guest RAM, MiB.
    pub memory_mib: u64,
    /// The host's TSC frequency in kHz, given to the guest under TCG (microvm with ACPI
    /// cannot calibrate its TSC otherwise and hangs).
    pub tsc_khz: Option<u64>,
    /// A QMP monitor on descriptor 4 (probe boots, to ask QEMU which accelerator ran).
    pub qmp: bool,
    /// A second virtio-serial port, [`crate::guest::BROKER_PORT_NAME`], on descriptor 5: the
    /// run's broker channel (runs with a grant only).
    pub broker: bool,
    /// A third virtio-serial port, [`crate::guest::EGRESS_PORT_NAME`], on descriptor 6: the
    /// streams of the guest's egress proxy endpoint (runs with an egress grant only).
    pub egress: bool,
}

/// The guest kernel's command line.
pub fn kernel_cmdline(shape: &QemuShape) -> String {
    let mut c = vec![
        "console=ttyS0",
        // reboot = triple fault; with -no-reboot QEMU exits. panic=-1: reboot on panic.
        "reboot=t",
        "panic=-1",
        "quiet",
        // Guest-internal hardening the guest does not need: its only tenant is the run.
        "mitigations=off",
        "no_timer_check",
        "rcupdate.rcu_expedited=1",
        "8250.nr_uarts=1",
        "cryptomgr.notests",
        "pci=off",
    ]
    .into_iter()
    .map(str::to_owned)
    .collect::<Vec<_>>();
    if shape.accelerator == Accelerator::Tcg
        && let Some(khz) = shape.tsc_khz
    {
        c.push(format!("tsc_early_khz={khz}"));
    }
    c.join(" ")
}

/// QEMU's arguments (after the program name). Paths are those inside the jail.
pub fn args(shape: &QemuShape) -> Vec<String> {
    let accel = match shape.accelerator {
        Accelerator::Kvm => "kvm".to_owned(),
        Accelerator::Tcg => format!("tcg,thread=multi,tb-size={TCG_TB_MIB}"),
    };
    let cpu = match shape.accelerator {
        Accelerator::Kvm => "host",
        Accelerator::Tcg => "max",
    };
    let mut a: Vec<String> = [
        "-nodefaults",
        "-no-user-config",
        "-nographic",
        "-no-reboot",
        "-sandbox",
        SANDBOX,
        "-nic",
        "none",
        "-accel",
        &accel,
        "-machine",
        MACHINE,
        "-cpu",
        cpu,
        "-smp",
        &shape.cpus.to_string(),
        "-m",
        &format!("{}M", shape.memory_mib),
        "-chardev",
        "stdio,id=console,signal=off",
        "-serial",
        "chardev:console",
        "-kernel",
        inside::KERNEL,
        "-initrd",
        inside::INITRD,
        "-append",
        &kernel_cmdline(shape),
        "-drive",
        &format!(
            "file={},if=none,id=disk,format=raw,readonly=on",
            inside::DISK
        ),
        "-device",
        "virtio-blk-device,drive=disk",
        "-device",
        "virtio-serial-device",
        "-chardev",
        &format!("socket,id=channel,fd={}", inside::CHANNEL_FD),
        "-device",
        &format!(
            "virtserialport,chardev=channel,name={}",
            crate::guest::PORT_NAME
        ),
    ]
    .into_iter()
    .map(str::to_owned)
    .collect();
    if shape.broker {
        a.extend(
            [
                "-chardev",
                &format!("socket,id=broker,fd={}", inside::BROKER_FD),
                "-device",
                &format!(
                    "virtserialport,chardev=broker,name={}",
                    crate::guest::BROKER_PORT_NAME
                ),
            ]
            .map(str::to_owned),
        );
    }
    if shape.egress {
        a.extend(
            [
                "-chardev",
                &format!("socket,id=egress,fd={}", inside::EGRESS_FD),
                "-device",
                &format!(
                    "virtserialport,chardev=egress,name={}",
                    crate::guest::EGRESS_PORT_NAME
                ),
            ]
            .map(str::to_owned),
        );
    }
    if shape.qmp {
        a.extend(
            [
                "-chardev",
                &format!("socket,id=qmp,fd={}", inside::QMP_FD),
                "-mon",
                "chardev=qmp,mode=control",
            ]
            .map(str::to_owned),
        );
    }
    a
}

/// The host's TSC frequency in kHz, from the first `cpu MHz` line of /proc/cpuinfo.
pub fn host_tsc_khz() -> Result<u64, TscError> {
    let text = std::fs::read_to_string("/proc/cpuinfo").map_err(TscError::Unreadable)?;
    parse_cpu_mhz(&text).ok_or(TscError::NoCpuMhz)
}

/// The host's TSC frequency is not to be had.
#[derive(Debug, thiserror::Error)]
pub enum TscError {
    /// /proc/cpuinfo cannot be read.
    #[error("cannot read /proc/cpuinfo: {0}")]
    Unreadable(std::io::Error),
    /// It names no frequency.
    #[error(
        "/proc/cpuinfo has no `cpu MHz` line: the TCG guest needs the host's TSC frequency (tsc_early_khz)"
    )]
    NoCpuMhz,
}

fn parse_cpu_mhz(cpuinfo: &str) -> Option<u64> {
    let mhz: f64 = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("cpu MHz")?.split_once(':'))?
        .1
        .trim()
        .parse()
        .ok()?;
    (mhz > 0.0).then(|| (mhz * 1000.0).round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(accelerator: Accelerator) -> QemuShape {
        QemuShape {
            accelerator,
            cpus: 2,
            memory_mib: 384,
            tsc_khz: Some(2_445_428),
            qmp: false,
            broker: false,
            egress: false,
        }
    }

    #[test]
    fn no_network_no_fallback_and_the_sandbox_on() {
        let a = args(&shape(Accelerator::Tcg));
        let joined = a.join(" ");
        assert!(joined.contains("-nodefaults -no-user-config -nographic -no-reboot"));
        assert!(joined.contains(&format!("-sandbox {SANDBOX}")));
        assert!(joined.contains("-nic none"));
        // One accelerator only: QEMU must not fall back from KVM to TCG by itself.
        assert_eq!(a.iter().filter(|x| *x == "-accel").count(), 1);
        assert!(joined.contains("-accel tcg,thread=multi"));
        assert!(!joined.contains("netdev") && !joined.contains("virtio-net"));
        assert!(joined.contains("tsc_early_khz=2445428"));
        assert!(!joined.contains("qmp"));
        let k = args(&QemuShape {
            qmp: true,
            ..shape(Accelerator::Kvm)
        })
        .join(" ");
        assert!(k.contains("-accel kvm -machine microvm,pit=on -cpu host"));
        assert!(!k.contains("tsc_early_khz"));
        assert!(k.contains("socket,id=qmp,fd=4 -mon chardev=qmp,mode=control"));
        assert!(!k.contains("broker"));
        let b = args(&QemuShape {
            broker: true,
            egress: false,
            ..shape(Accelerator::Tcg)
        })
        .join(" ");
        assert!(b.contains(
            "-chardev socket,id=broker,fd=5 -device virtserialport,chardev=broker,name=plimsoll.broker"
        ));
        // The broker is a serial port, never a network device.
        assert!(b.contains("-nic none") && !b.contains("netdev"));
    }

    #[test]
    fn reads_the_host_mhz() {
        let text = "processor\t: 0\ncpu MHz\t\t: 2445.428\ncache size\t: 512 KB\n";
        assert_eq!(parse_cpu_mhz(text), Some(2_445_428));
        assert_eq!(parse_cpu_mhz("processor : 0\n"), None);
    }
}
