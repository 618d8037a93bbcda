//! Egress profiles: the `[egress.NAME]` tables of the grants file, validated.
//!
//! An egress profile lets a run's code open connections, through the broker, to the hosts and
//! ports it lists; docs/capability-grants.md ("Egress") describes every key.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::profile::GrantsSource;

use plimsoll_egress::rules::{Cidr, HostPattern};
use plimsoll_egress::target::{Host, parse_host};
use serde::Deserialize;

/// Connections (allowed or refused) a run may ask for in all, unless its profile says
/// otherwise.
pub const DEFAULT_EGRESS_CONNECTIONS: u32 = 256;
/// The most a profile may allow.
pub const MAX_EGRESS_CONNECTIONS: u32 = 10_000;
/// Connections a run may hold open at once, unless its profile says otherwise.
pub const DEFAULT_EGRESS_OPEN: u32 = 16;
/// The most at once a profile may allow.
pub const MAX_EGRESS_OPEN: u32 = 64;
/// Bytes a run may send, in all its connections, unless its profile says otherwise.
pub const DEFAULT_EGRESS_BYTES_UP: u64 = 64 << 20;
/// Bytes a run may receive, in all its connections, unless its profile says otherwise.
pub const DEFAULT_EGRESS_BYTES_DOWN: u64 = 1 << 30;
/// The most either byte budget may be.
pub const MAX_EGRESS_BYTES: u64 = 64 << 30;
/// How long connecting to a host may take.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// One `[egress.NAME]` table, as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct EgressEntry {
    callers: Vec<String>,
    hosts: Vec<String>,
    ports: Option<Vec<u16>>,
    addresses: Option<Vec<String>>,
    resolve: Option<BTreeMap<String, Vec<String>>>,
    max_connections: Option<u32>,
    max_open: Option<u32>,
    max_bytes_up: Option<u64>,
    max_bytes_down: Option<u64>,
    max_connection_secs: Option<u64>,
    connect_timeout_ms: Option<u64>,
    trials: Option<bool>,
}

/// One validated egress profile.
#[derive(Debug)]
pub struct EgressProfile {
    name: String,
    callers: BTreeSet<String>,
    hosts: Vec<HostPattern>,
    ports: Vec<u16>,
    addresses: Vec<Cidr>,
    resolve: BTreeMap<String, Vec<IpAddr>>,
    max_connections: u32,
    max_open: u32,
    max_bytes_up: u64,
    max_bytes_down: u64,
    max_connection_time: Option<Duration>,
    connect_timeout: Duration,
    trials: bool,
    source: OnceLock<Arc<GrantsSource>>,
}

impl EgressProfile {
    /// The load of the grants file it came from.
    pub(crate) fn source(&self) -> Option<&Arc<GrantsSource>> {
        self.source.get()
    }
    pub(crate) fn set_source(&self, source: Arc<GrantsSource>) -> Result<(), Arc<GrantsSource>> {
        self.source.set(source)
    }
    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// The hosts it allows, as written (`pypi.org`, `*.pythonhosted.org`).
    pub fn hosts(&self) -> &[HostPattern] {
        &self.hosts
    }
    /// The ports it allows (443 unless the profile lists others).
    pub fn ports(&self) -> &[u16] {
        &self.ports
    }
    /// Address ranges a host may resolve to beyond public addresses.
    pub fn addresses(&self) -> &[Cidr] {
        &self.addresses
    }
    /// The operator's fixed addresses for names (like `curl --resolve`); the address rules
    /// still apply to them.
    pub fn pinned(&self, name: &str) -> Option<&[IpAddr]> {
        self.resolve.get(name).map(Vec::as_slice)
    }
    /// Connections (allowed or refused) a run may ask for in all.
    pub fn max_connections(&self) -> u32 {
        self.max_connections
    }
    /// Connections a run may hold open at once.
    pub fn max_open(&self) -> u32 {
        self.max_open
    }
    /// Bytes a run may send in all its connections.
    pub fn max_bytes_up(&self) -> u64 {
        self.max_bytes_up
    }
    /// Bytes a run may receive in all its connections.
    pub fn max_bytes_down(&self) -> u64 {
        self.max_bytes_down
    }
    /// How long one connection may last, if shorter than the run.
    pub fn max_connection_time(&self) -> Option<Duration> {
        self.max_connection_time
    }
    /// How long connecting to a host may take.
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }
    /// Whether a run with a trial step may hold it.
    pub fn trials(&self) -> bool {
        self.trials
    }
    /// True when `caller` may use this profile.
    pub fn allows(&self, caller: &str) -> bool {
        self.callers.contains(caller)
    }
    /// The first host pattern that allows `name`.
    pub fn host_rule(&self, name: &str) -> Option<&HostPattern> {
        self.hosts.iter().find(|p| p.matches(name))
    }
    /// The first address range that holds `ip`.
    pub fn address_rule(&self, ip: IpAddr) -> Option<&Cidr> {
        self.addresses.iter().find(|c| c.contains(ip))
    }
}

/// Validates one `[egress.NAME]` table; `Err` says what is wrong and what to write instead.
pub(crate) fn validate_egress(name: &str, e: EgressEntry) -> Result<EgressProfile, String> {
    if e.callers.is_empty() {
        return Err("`callers` is empty: name the callers that may use it (`local` for the CLI's embedded engine)".into());
    }
    if let Some(bad) = e.callers.iter().find(|c| !crate::profile::valid_name(c)) {
        return Err(format!(
            "caller `{bad}` is not a caller name (1 to 64 characters of a-z 0-9 . _ -)"
        ));
    }
    if e.hosts.is_empty() {
        return Err(
            "`hosts` is empty: list the hosts it allows, e.g. [\"pypi.org\", \"*.pythonhosted.org\"]"
                .into(),
        );
    }
    let hosts = e
        .hosts
        .iter()
        .map(|h| {
            HostPattern::parse(h).map_err(|why| {
                format!("host `{h}`: {why} (write a name, `pypi.org`, or `*.suffix`; never an address: list address ranges in `addresses`)")
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let ports = e.ports.unwrap_or_else(|| vec![443]);
    if ports.is_empty() || ports.contains(&0) {
        return Err("`ports` must list ports 1 to 65535 (or be left out for 443 alone)".into());
    }
    let addresses = e
        .addresses
        .unwrap_or_default()
        .iter()
        .map(|a| {
            Cidr::parse(a).map_err(|why| {
                format!(
                    "address range `{a}`: {why} (write `10.0.0.0/8`, `127.0.0.1/32` or `fd00::/8`)"
                )
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut resolve = BTreeMap::new();
    for (host, addrs) in e.resolve.unwrap_or_default() {
        let name = match parse_host(&host) {
            Ok(Host::Name(n)) => n,
            _ => {
                return Err(format!(
                    "resolve: `{host}` is not a host name: pin names only"
                ));
            }
        };
        if addrs.is_empty() {
            return Err(format!("resolve: `{host}` lists no address"));
        }
        let ips = addrs
            .iter()
            .map(|a| {
                a.parse::<IpAddr>()
                    .map_err(|_| format!("resolve: `{a}` for `{host}` is not an IP address"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        resolve.insert(name, ips);
    }
    let bounded = |key: &str, v: Option<u64>, default: u64, max: u64| match v {
        None => Ok(default),
        Some(v) if (1..=max).contains(&v) => Ok(v),
        Some(_) => Err(format!("`{key}` must be 1 to {max}")),
    };
    let max_connections = bounded(
        "max_connections",
        e.max_connections.map(u64::from),
        u64::from(DEFAULT_EGRESS_CONNECTIONS),
        u64::from(MAX_EGRESS_CONNECTIONS),
    )? as u32;
    let max_open = bounded(
        "max_open",
        e.max_open.map(u64::from),
        u64::from(DEFAULT_EGRESS_OPEN),
        u64::from(MAX_EGRESS_OPEN),
    )? as u32;
    let max_bytes_up = bounded(
        "max_bytes_up",
        e.max_bytes_up,
        DEFAULT_EGRESS_BYTES_UP,
        MAX_EGRESS_BYTES,
    )?;
    let max_bytes_down = bounded(
        "max_bytes_down",
        e.max_bytes_down,
        DEFAULT_EGRESS_BYTES_DOWN,
        MAX_EGRESS_BYTES,
    )?;
    let max_connection_time = match e.max_connection_secs {
        None => None,
        Some(s) => Some(Duration::from_secs(bounded(
            "max_connection_secs",
            Some(s),
            0,
            86_400,
        )?)),
    };
    let connect_timeout = Duration::from_millis(bounded(
        "connect_timeout_ms",
        e.connect_timeout_ms,
        DEFAULT_CONNECT_TIMEOUT.as_millis() as u64,
        120_000,
    )?);
    Ok(EgressProfile {
        name: name.to_owned(),
        callers: e.callers.into_iter().collect(),
        hosts,
        ports,
        addresses,
        resolve,
        max_connections,
        max_open,
        max_bytes_up,
        max_bytes_down,
        max_connection_time,
        connect_timeout,
        trials: e.trials.unwrap_or(false),
        source: OnceLock::new(),
    })
}
