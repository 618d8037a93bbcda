//! Isolation tiers, weakest first.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// How strong the wall around a run was. The order is the order of strength:
/// `Process < Container < Kernel < Vm`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Tier {
    /// A hardened child process on the host kernel: no wall for hostile code.
    Process,
    /// An OCI container (crun or runc): namespaces, cgroups, seccomp; the host kernel is shared.
    Container,
    /// A user-space kernel (gVisor) or an emulated guest (QEMU under TCG) between the code and
    /// the host kernel.
    Kernel,
    /// A guest under hardware virtualisation (QEMU with KVM).
    Vm,
}

impl Tier {
    /// Every tier, weakest first.
    pub const ALL: [Tier; 4] = [Tier::Process, Tier::Container, Tier::Kernel, Tier::Vm];

    /// The lowercase wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Process => "process",
            Tier::Container => "container",
            Tier::Kernel => "kernel",
            Tier::Vm => "vm",
        }
    }
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A tier name that is not one of `process`, `container`, `kernel`, `vm`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown isolation tier `{given}`: use one of process, container, kernel, vm")]
pub struct ParseTierError {
    /// What was given.
    pub given: String,
}

impl FromStr for Tier {
    type Err = ParseTierError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Tier::ALL
            .into_iter()
            .find(|t| t.as_str() == s)
            .ok_or_else(|| ParseTierError {
                given: s.to_owned(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiers_are_ordered_weakest_first() {
        assert!(Tier::Process < Tier::Container);
        assert!(Tier::Container < Tier::Kernel);
        assert!(Tier::Kernel < Tier::Vm);
    }

    #[test]
    fn names_round_trip() {
        for t in Tier::ALL {
            assert_eq!(t.as_str().parse::<Tier>().unwrap(), t);
            assert_eq!(serde_json::to_string(&t).unwrap(), format!("\"{t}\""));
        }
        let err = "VM".parse::<Tier>().unwrap_err();
        assert!(err.to_string().contains("process, container, kernel, vm"));
    }
}
