//! `plimsoll doctor`: which tiers this host can offer now, and, in plain words, what each
//! missing one would take. Exit status 0 when the default floor can be served, 1 when not.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;

use plimsoll_engine::settings::Settings;
use plimsoll_wire::{ProviderInfo, Tier};
use serde_json::{Value, json};

use crate::args::DoctorArgs;
use crate::host::{self, CgroupLayout, Kvm, one_line};
use crate::local::{load_settings, settings_path};
use crate::{EXIT_FAILED, EXIT_OK, Failure};

/// What doctor found: the host facts and every provider's probe.
struct Findings {
    settings_file: Option<String>,
    default_floor: Tier,
    /// The providers the settings name, if they name any.
    configured: Option<Vec<String>>,
    providers: Vec<ProviderInfo>,
    kvm: Kvm,
    cgroups: CgroupLayout,
    image: String,
    image_present: bool,
    vm_assets: String,
    vm_assets_present: bool,
    runtimes: Vec<(String, String, bool, &'static str)>,
}

impl Findings {
    fn configured(&self, name: &str) -> bool {
        self.configured
            .as_ref()
            .is_none_or(|list| list.iter().any(|n| n == name))
    }

    /// Providers offered now (and configured, when the settings name providers) at `tier`.
    fn offering(&self, tier: Tier) -> Vec<&ProviderInfo> {
        self.providers
            .iter()
            .filter(|p| p.available && p.isolation == tier && self.configured(&p.name))
            .collect()
    }

    /// Providers offered now at or above the default floor.
    fn serving_default_floor(&self) -> Vec<&ProviderInfo> {
        self.providers
            .iter()
            .filter(|p| {
                p.available && p.isolation >= self.default_floor && self.configured(&p.name)
            })
            .collect()
    }

    /// What it would take to get `tier`, in plain words, one step a line.
    fn to_get(&self, tier: Tier) -> Vec<String> {
        let mut steps = Vec::new();
        // Offered here but left out of the settings' list.
        for p in self
            .providers
            .iter()
            .filter(|p| p.available && p.isolation == tier && !self.configured(&p.name))
        {
            steps.push(format!(
                "{} passed its probe at tier {tier} but is not in `providers` of {}: add it",
                p.name,
                self.settings_file.as_deref().unwrap_or("the settings file")
            ));
        }
        for p in self
            .providers
            .iter()
            .filter(|p| host::reaches(&p.name).contains(&tier))
        {
            if p.available && p.isolation == tier {
                continue; // offered but not configured: said above
            }
            if tier == Tier::Vm && p.name == "qemu" {
                steps.push(self.kvm_step(p));
                continue;
            }
            if let Some((_, path, present, package)) =
                self.runtimes.iter().find(|(n, ..)| *n == p.name)
                && !present
            {
                steps.push(format!(
                    "{}: no binary at {path}: install the Debian package `{package}` \
                     (`apt-get install {package}`; scripts/install-deps installs it)",
                    p.name
                ));
                continue;
            }
            if matches!(p.name.as_str(), "crun" | "runc" | "runsc") && !self.image_present {
                steps.push(format!(
                    "{}: no sandbox image at {}: build it with `make images` \
                     (scripts/build-image), or set [oci] image to where it is",
                    p.name, self.image
                ));
                continue;
            }
            if p.name == "qemu" && !self.vm_assets_present {
                steps.push(format!(
                    "qemu: no VM assets at {}: build them with `make vm-assets` \
                     (scripts/build-vm-assets), or set [qemu] assets to where they are",
                    self.vm_assets
                ));
                continue;
            }
            if matches!(p.name.as_str(), "crun" | "runc") && self.cgroups == CgroupLayout::None {
                steps.push(format!("{}: {}", p.name, self.cgroups.meaning()));
            }
            let why = one_line(p.unavailable_reason.as_deref());
            steps.push(if why.starts_with(p.name.as_str()) {
                why
            } else {
                format!("{}: {why}", p.name)
            });
        }
        steps
    }

    /// Why qemu gives no `vm` here, and what would.
    fn kvm_step(&self, qemu: &ProviderInfo) -> String {
        let attempt = qemu
            .evidence
            .config
            .get("kvm_attempt")
            .map(|s| one_line(Some(s)));
        let need = "the vm tier needs KVM that boots a stock guest kernel: hardware \
                    virtualisation (Intel VT-x or AMD-V) enabled in the firmware and the \
                    kvm_intel or kvm_amd module loaded, or, in a cloud VM, an instance type \
                    with nested virtualisation";
        match &self.kvm {
            Kvm::Absent => format!("qemu: there is no /dev/kvm on this host: {need}"),
            Kvm::NotOpenable(e) => {
                format!("qemu: /dev/kvm exists but cannot be opened ({e}): {need}")
            }
            Kvm::Present if qemu.available => format!(
                "qemu: /dev/kvm is present but cannot run a guest{}, so QEMU runs under TCG \
                 (emulation, the kernel tier): {need}",
                attempt.map(|a| format!(" ({a})")).unwrap_or_default()
            ),
            Kvm::Present => format!(
                "qemu: its probe failed: {}; /dev/kvm is present",
                one_line(qemu.unavailable_reason.as_deref())
            ),
        }
    }

    fn to_json(&self) -> Value {
        let serving: Vec<&str> = self
            .serving_default_floor()
            .iter()
            .map(|p| p.name.as_str())
            .collect();
        let tiers: Vec<Value> = Tier::ALL
            .iter()
            .map(|t| {
                let by: Vec<&str> = self.offering(*t).iter().map(|p| p.name.as_str()).collect();
                json!({
                    "tier": t,
                    "offered": !by.is_empty(),
                    "offered_by": by,
                    "to_get_it": if by.is_empty() { self.to_get(*t) } else { Vec::new() },
                })
            })
            .collect();
        let providers: Vec<Value> = self
            .providers
            .iter()
            .map(|p| {
                json!({
                    "name": p.name,
                    "tier": p.isolation,
                    "available": p.available,
                    "configured": self.configured(&p.name),
                    "unavailable_reason": p.unavailable_reason,
                    "evidence_sha256": p.evidence_sha256,
                })
            })
            .collect();
        let kvm_detail = match &self.kvm {
            Kvm::NotOpenable(e) => Some(e.clone()),
            _ => None,
        };
        json!({
            "settings_file": self.settings_file,
            "default_floor": self.default_floor,
            "default_floor_served": !serving.is_empty(),
            "default_floor_served_by": serving,
            "tiers": tiers,
            "providers": providers,
            "host": {
                "kvm": { "state": self.kvm.name(), "detail": kvm_detail },
                "cgroups": { "layout": self.cgroups.name(), "meaning": self.cgroups.meaning() },
                "image": { "path": self.image, "present": self.image_present },
                "vm_assets": { "path": self.vm_assets, "present": self.vm_assets_present },
                "runtimes": self.runtimes.iter().map(|(name, path, present, package)| json!({
                    "provider": name, "path": path, "present": present, "package": package,
                })).collect::<Vec<_>>(),
            },
        })
    }

    fn render(&self) -> String {
        let mut s = String::new();
        let serving = self.serving_default_floor();
        if serving.is_empty() {
            let _ = writeln!(
                s,
                "default floor {}: NOT served here (a run that sets no floor is refused)",
                self.default_floor
            );
        } else {
            let names: Vec<&str> = serving.iter().map(|p| p.name.as_str()).collect();
            let _ = writeln!(
                s,
                "default floor {}: served (by {})",
                self.default_floor,
                names.join(", ")
            );
        }
        let _ = writeln!(
            s,
            "settings: {}",
            self.settings_file
                .as_deref()
                .unwrap_or("none (built-in defaults, every provider)")
        );
        s.push('\n');
        for t in Tier::ALL {
            let by = self.offering(t);
            if by.is_empty() {
                let _ = writeln!(s, "{:<9}  missing. To get it:", t.to_string());
                for step in self.to_get(t) {
                    let _ = writeln!(s, "  - {step}");
                }
            } else {
                let names: Vec<&str> = by.iter().map(|p| p.name.as_str()).collect();
                let _ = writeln!(s, "{:<9}  offered by {}", t.to_string(), names.join(", "));
            }
        }
        let _ = writeln!(s, "\nproviders:");
        for p in &self.providers {
            let state = if p.available {
                format!("offered at tier {}", p.isolation)
            } else {
                format!("not offered: {}", one_line(p.unavailable_reason.as_deref()))
            };
            let configured = if self.configured(&p.name) {
                ""
            } else {
                " (not in the settings' providers)"
            };
            let _ = writeln!(s, "  {:<8} {state}{configured}", p.name);
        }
        let _ = writeln!(s, "\nhost:");
        let kvm = match &self.kvm {
            Kvm::Absent => "absent".to_owned(),
            Kvm::NotOpenable(e) => format!("present, cannot be opened: {e}"),
            Kvm::Present => "present (whether it runs guests: see qemu above)".to_owned(),
        };
        let _ = writeln!(s, "  /dev/kvm: {kvm}");
        let _ = writeln!(
            s,
            "  cgroups: {}: {}",
            self.cgroups.name(),
            self.cgroups.meaning()
        );
        let _ = writeln!(
            s,
            "  sandbox image: {} ({})",
            self.image,
            if self.image_present {
                "present"
            } else {
                "missing: make images"
            }
        );
        let _ = writeln!(
            s,
            "  VM assets: {} ({})",
            self.vm_assets,
            if self.vm_assets_present {
                "present"
            } else {
                "missing: make vm-assets"
            }
        );
        for (name, path, present, package) in &self.runtimes {
            let _ = writeln!(
                s,
                "  {name}: {path} ({})",
                if *present {
                    "present".to_owned()
                } else {
                    format!("missing: apt-get install {package}")
                }
            );
        }
        s
    }
}

/// Runs `plimsoll doctor`.
pub fn doctor(config: Option<&Path>, a: &DoctorArgs) -> Result<u8, Failure> {
    let settings: Settings = load_settings(config)?;
    let settings_file = settings_path(config).map(|p| p.display().to_string());
    let names = host::all_providers();
    let providers = host::probe(&settings, &names)?;
    let image = host::image_dir(&settings);
    let vm_assets = host::vm_assets_dir(&settings);
    let runtimes = names
        .iter()
        .filter_map(|n| {
            host::runtime_binary(&settings, n).map(|(path, package)| {
                (
                    n.clone(),
                    path.display().to_string(),
                    path.is_file(),
                    package,
                )
            })
        })
        .collect();
    let f = Findings {
        settings_file,
        default_floor: settings.engine_config().default_floor,
        configured: settings.providers.clone(),
        providers,
        kvm: Kvm::detect(),
        cgroups: CgroupLayout::detect(),
        image_present: image.join("identity").is_file(),
        image: image.display().to_string(),
        vm_assets_present: vm_assets.join("vmlinux").is_file(),
        vm_assets: vm_assets.display().to_string(),
        runtimes,
    };
    let mut out = std::io::stdout().lock();
    if a.json {
        let _ = serde_json::to_writer_pretty(&mut out, &f.to_json());
        let _ = writeln!(out);
    } else {
        let _ = out.write_all(f.render().as_bytes());
    }
    let _ = out.flush();
    Ok(if f.serving_default_floor().is_empty() {
        EXIT_FAILED
    } else {
        EXIT_OK
    })
}
