//! `plimsoll providers`: each provider, its tier, whether it is offered, and the evidence.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;

use anyhow::anyhow;
use plimsoll_wire::{ProviderInfo, ProvidersResponse};

use crate::args::ProvidersArgs;
use crate::local::{client, daemon_url, embedded_engine, load_settings};
use crate::{EXIT_OK, Failure};

/// Runs `plimsoll providers`.
pub fn providers(config: Option<&Path>, a: &ProvidersArgs) -> Result<u8, Failure> {
    let response = match daemon_url(a.daemon.as_deref()) {
        Some(url) => client(&url)?
            .providers()
            .map_err(|e| Failure::failed(anyhow!(e)))?,
        None => {
            let settings = load_settings(config)?;
            embedded_engine(&settings)?.providers_response()
        }
    };
    let mut out = std::io::stdout().lock();
    if a.json {
        let _ = serde_json::to_writer_pretty(&mut out, &response);
        let _ = writeln!(out);
    } else {
        let _ = out.write_all(render(&response).as_bytes());
    }
    let _ = out.flush();
    Ok(EXIT_OK)
}

/// The human form: one block per provider.
pub fn render(r: &ProvidersResponse) -> String {
    let mut s = format!(
        "default floor: {} (the floor of a run that sets none)\n",
        r.default_floor
    );
    if r.providers.is_empty() {
        s.push_str("no provider is configured: nothing can run\n");
    }
    for p in &r.providers {
        s.push('\n');
        s.push_str(&render_one(p));
    }
    s
}

fn render_one(p: &ProviderInfo) -> String {
    let mut s = String::new();
    let state = if p.available {
        "available".to_owned()
    } else {
        format!(
            "unavailable: {}",
            p.unavailable_reason.as_deref().unwrap_or("no reason given")
        )
    };
    let _ = writeln!(s, "{}  tier {}  {}", p.name, p.isolation, state);
    let ev = &p.evidence;
    let _ = writeln!(s, "  environment: {}", ev.environment);
    if !ev.binaries.is_empty() {
        let bins: Vec<String> = ev
            .binaries
            .iter()
            .map(|b| format!("{} {} ({})", b.name, b.version, b.path))
            .collect();
        let _ = writeln!(s, "  binaries: {}", bins.join(", "));
    }
    match &ev.probe {
        Some(probe) => {
            let _ = writeln!(
                s,
                "  probe: uid {}, gid {}, seccomp mode {}, no_new_privs {}, {} network interface(s), kernel {}",
                probe.uid,
                probe.gid,
                probe.seccomp_mode,
                if probe.no_new_privs { "yes" } else { "no" },
                probe.network_interfaces.len(),
                probe.kernel_release
            );
        }
        None => s.push_str("  probe: did not run\n"),
    }
    let failed: Vec<String> = ev
        .checks
        .iter()
        .filter(|(_, outcome)| outcome.as_str() != "ok")
        .map(|(name, outcome)| format!("{name}: {outcome}"))
        .collect();
    let ok = ev.checks.len() - failed.len();
    if failed.is_empty() {
        let _ = writeln!(s, "  checks: {ok} ok");
    } else {
        let _ = writeln!(
            s,
            "  checks: {ok} ok, {} failed ({})",
            failed.len(),
            failed.join("; ")
        );
    }
    let _ = writeln!(s, "  evidence sha256: {}", p.evidence_sha256);
    s
}

#[cfg(test)]
mod tests {
    use plimsoll_wire::{BinaryIdentity, Evidence, ProbeReport, Tier};

    use super::*;

    #[test]
    fn renders_availability_binaries_probe_and_failed_checks() {
        let info = ProviderInfo {
            name: "process".into(),
            isolation: Tier::Process,
            available: false,
            unavailable_reason: Some("seccomp missing: upgrade the kernel".into()),
            evidence: Evidence {
                provider: "process".into(),
                isolation: Tier::Process,
                config: Default::default(),
                binaries: vec![BinaryIdentity {
                    name: "node".into(),
                    path: "/usr/bin/node".into(),
                    version: "v20.1.0".into(),
                    sha256: "0".repeat(64),
                }],
                probe: Some(ProbeReport {
                    uid: 2000000,
                    ..ProbeReport::default()
                }),
                checks: [
                    ("uid".to_string(), "ok".to_string()),
                    ("seccomp".to_string(), "mode 0, expected 2".to_string()),
                ]
                .into(),
                environment: "plimsoll-engine/0.1.0".into(),
                checked_unix_ms: 1,
            },
            evidence_sha256: "e".repeat(64),
        };
        let text = render(&ProvidersResponse {
            images: Vec::new(),
            protocol: plimsoll_wire::PROTOCOL,
            default_floor: Tier::Container,
            providers: vec![info],
        });
        assert!(text.contains("default floor: container"), "{text}");
        assert!(
            text.contains("process  tier process  unavailable: seccomp missing"),
            "{text}"
        );
        assert!(text.contains("node v20.1.0 (/usr/bin/node)"), "{text}");
        assert!(text.contains("probe: uid 2000000"), "{text}");
        assert!(
            text.contains("1 ok, 1 failed (seccomp: mode 0, expected 2)"),
            "{text}"
        );
    }
}
