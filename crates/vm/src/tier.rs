//! The tier rule of the VM provider, written once: the tier follows the accelerator that
//! actually ran the guest, as QEMU reports it, never the one that was asked for.
//!
//! KVM (hardware virtualisation) is `vm`; TCG (QEMU's instruction emulator, which QEMU's own
//! security policy does not count as a security boundary) is `kernel`. docs/isolation-tiers.md
//! states the same rule.

use std::fmt;

use plimsoll_wire::Tier;

/// What executed the guest's instructions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Accelerator {
    /// Hardware virtualisation through /dev/kvm.
    Kvm,
    /// QEMU's Tiny Code Generator: the guest is emulated in user space.
    Tcg,
}

impl Accelerator {
    /// QEMU's name (`-accel NAME`).
    pub fn as_str(self) -> &'static str {
        match self {
            Accelerator::Kvm => "kvm",
            Accelerator::Tcg => "tcg",
        }
    }
}

impl fmt::Display for Accelerator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The tier rule: the only place an accelerator becomes a tier.
pub fn tier_for(accelerator: Accelerator) -> Tier {
    match accelerator {
        Accelerator::Kvm => Tier::Vm,
        Accelerator::Tcg => Tier::Kernel,
    }
}

/// What QEMU said about KVM for a guest that booted (QMP `query-kvm`), beside what was asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AccelEvidence {
    /// The accelerator on QEMU's command line.
    pub requested: Accelerator,
    /// `query-kvm` → `enabled`: KVM is running this guest.
    pub kvm_enabled: bool,
    /// `query-kvm` → `present`: QEMU was built with KVM support.
    pub kvm_present: bool,
}

impl AccelEvidence {
    /// From QEMU's answer to `{"execute":"query-kvm"}`, e.g.
    /// `{"return": {"enabled": true, "present": true}}`.
    pub fn from_query_kvm(requested: Accelerator, answer: &str) -> Result<Self, QueryKvmError> {
        let v: serde_json::Value =
            serde_json::from_str(answer).map_err(|e| QueryKvmError::NotJson {
                error: e.to_string(),
                answer: answer.to_owned(),
            })?;
        let ret = v
            .get("return")
            .ok_or_else(|| QueryKvmError::Failed(answer.to_owned()))?;
        let flag = |name: &'static str| {
            ret.get(name)
                .and_then(serde_json::Value::as_bool)
                .ok_or_else(|| QueryKvmError::Lacks {
                    member: name,
                    answer: answer.to_owned(),
                })
        };
        Ok(AccelEvidence {
            requested,
            kvm_enabled: flag("enabled")?,
            kvm_present: flag("present")?,
        })
    }

    /// The accelerator that ran the guest, by QEMU's own account.
    pub fn ran(&self) -> Accelerator {
        if self.kvm_enabled {
            Accelerator::Kvm
        } else {
            Accelerator::Tcg
        }
    }

    /// `Err` when QEMU ran something other than what was asked.
    pub fn consistent(&self) -> Result<(), AccelMismatch> {
        if self.ran() == self.requested {
            Ok(())
        } else {
            Err(AccelMismatch {
                requested: self.requested,
                ran: self.ran(),
            })
        }
    }
}

/// QEMU's answer to `query-kvm` says nothing usable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueryKvmError {
    /// Not JSON.
    #[error("query-kvm answer is not JSON ({error}): {answer:?}")]
    NotJson {
        /// The parser's complaint.
        error: String,
        /// The answer.
        answer: String,
    },
    /// An error answer.
    #[error("query-kvm failed: {0:?}")]
    Failed(String),
    /// A member is missing or not a boolean.
    #[error("query-kvm answer lacks `{member}`: {answer:?}")]
    Lacks {
        /// The member.
        member: &'static str,
        /// The answer.
        answer: String,
    },
}

/// QEMU ran another accelerator than the one asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("asked QEMU for {requested} but query-kvm says {ran} ran the guest")]
pub struct AccelMismatch {
    /// What was asked.
    pub requested: Accelerator,
    /// What ran.
    pub ran: Accelerator,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kvm_is_vm_and_tcg_is_kernel() {
        // The evidence record a KVM-accelerated probe boot produces.
        let kvm = AccelEvidence::from_query_kvm(
            Accelerator::Kvm,
            r#"{"return": {"enabled": true, "present": true}}"#,
        )
        .unwrap();
        assert_eq!(kvm.ran(), Accelerator::Kvm);
        kvm.consistent().unwrap();
        assert_eq!(tier_for(kvm.ran()), Tier::Vm);

        // And the one this PVM host produces: TCG ran it, KVM support is built in.
        let tcg = AccelEvidence::from_query_kvm(
            Accelerator::Tcg,
            r#"{"return": {"enabled": false, "present": true}}"#,
        )
        .unwrap();
        assert_eq!(tcg.ran(), Accelerator::Tcg);
        assert_eq!(tier_for(tcg.ran()), Tier::Kernel);
    }

    #[test]
    fn asking_is_not_evidence() {
        // KVM asked for, TCG ran: the tier is TCG's and the record is flagged.
        let e = AccelEvidence::from_query_kvm(
            Accelerator::Kvm,
            r#"{"return": {"enabled": false, "present": true}}"#,
        )
        .unwrap();
        assert_eq!(tier_for(e.ran()), Tier::Kernel);
        assert!(e.consistent().is_err());
        assert!(AccelEvidence::from_query_kvm(Accelerator::Tcg, r#"{"error": {}}"#).is_err());
        assert!(AccelEvidence::from_query_kvm(Accelerator::Tcg, "nonsense").is_err());
    }
}
