//! The engine proper: probes providers, checks the floor before dispatch, routes, admits,
//! runs, and builds the response with its digests and record.

use std::path::Path;
use std::sync::{Arc, RwLock};

use plimsoll_broker::apart::Brokers;
use plimsoll_broker::{Finished, GrantProfiles, LoadGrantsError};
use plimsoll_sandbox::{Probed, Provider, RunImage, RunningIn};
use plimsoll_wire::digest::{evidence_sha256, record_sha256, request_sha256, result_sha256};
use plimsoll_wire::{
    PROTOCOL, ProviderInfo, Reason, RunRecord, RunRequest, RunResponse, RunResult, Start,
};

use crate::admission::{Admission, validate_uid_range};
use crate::config::EngineConfig;
use crate::error::{BuildEngineError, RunError};
use crate::evidence_cache::EvidenceCache;
use crate::ids::new_run_id;
use crate::plan::{ProviderView, Unavailable, plan};
use crate::pool::{PoolConfig, PoolCounts, Pools, ProviderNow};
use crate::providers::AnyProvider;
use crate::recheck::{Recheck, RecheckState, STALE};

/// A provider with its latest probe.
#[derive(Debug)]
pub(crate) struct Slot {
    pub(crate) provider: AnyProvider,
    /// Shared whole: a run takes a snapshot of every provider's without copying evidence.
    probed: RwLock<Option<Arc<ProbedState>>>,
    /// The uid its probe runs as, its own (`admission::probe_uid`).
    probe_uid: u32,
    /// Held while its probe runs: one probe per provider at a time (start-up, re-check and
    /// a re-probe after a failure may meet).
    probing: std::sync::Mutex<()>,
    /// Whether it is being probed again, and whether its environment moved.
    recheck: RecheckState,
}

#[derive(Debug, Clone)]
pub(crate) struct ProbedState {
    pub(crate) probed: Probed,
    pub(crate) evidence_sha256: String,
    /// Read from the evidence cache, not probed by this engine.
    cached: bool,
}

/// The evidence a provider is offered on now, as [`Engine::evidence`] gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderEvidence {
    /// The evidence.
    pub evidence: plimsoll_wire::Evidence,
    /// Its digest (a run's `record.evidence_sha256`).
    pub evidence_sha256: String,
    /// It came from the host's evidence cache ([`EvidenceCache`]), not from a probe of
    /// this engine.
    pub cached: bool,
}

/// The engine. Cheap to share behind an `Arc`; every method takes `&self`.
#[derive(Debug)]
pub struct Engine {
    pub(crate) config: EngineConfig,
    /// Shared with the background re-checks a failed run starts.
    pub(crate) slots: Arc<[Slot]>,
    pub(crate) admission: Arc<Admission>,
    /// Swapped whole by [`Engine::replace_grants`]; a run takes its profile out once, so a
    /// run in flight keeps the profile it started with.
    grants: RwLock<Arc<GrantProfiles>>,
    /// Where runs' brokers run: here, or in the daemon's broker process.
    pub(crate) brokers: Brokers,
    /// Evidence this host checked recently, consulted by [`Engine::probe_for`] only.
    cache: Option<EvidenceCache>,
    /// The warm pools and the configuration they were built from; kept by a thread of
    /// their own once [`Engine::start_pools`] is called, swapped whole by
    /// [`Engine::replace_pools`].
    pools: RwLock<PoolSet>,
    /// Held while the keeper is started, stopped or the pools are swapped; set once
    /// [`Engine::start_pools`] was called, until [`Engine::stop_pools`].
    keeper: std::sync::Mutex<Keeper>,
    /// The first uid past every other uid of the engine: members' uids start here.
    first_pool_uid: u32,
    /// The pools' counts, kept across a swap.
    pool_counts: Arc<PoolCounts>,
    /// Cold runs' removals, run after their answer.
    cold_teardowns: Arc<crate::pool::Teardowns>,
    /// Open sessions and what is remembered of ended ones.
    pub(crate) sessions: Arc<crate::session::Sessions>,
}

/// The pools in force and their configuration.
#[derive(Debug)]
struct PoolSet {
    configs: Vec<PoolConfig>,
    pools: Arc<Pools>,
}

/// The keeper thread, and whether the pools should be kept at all.
#[derive(Debug, Default)]
struct Keeper {
    thread: Option<std::thread::JoinHandle<()>>,
    wanted: bool,
}

/// What [`Engine::replace_pools`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolsReplaced {
    /// The configuration is the one in force: nothing was touched.
    Unchanged,
    /// The old pools were drained (every idle member destroyed) and the new ones are kept.
    Replaced,
}

/// The pools `configs` ask for over providers named `names` (in the engine's order), with
/// members' uids from `first_uid` and the fixed limits of `config`'s defaults. Refuses a pool
/// of a provider that is not configured and uids that do not fit.
fn build_pools(
    config: &EngineConfig,
    configs: &[PoolConfig],
    names: &[&str],
    first_uid: u32,
    counts: Arc<PoolCounts>,
) -> Result<Arc<Pools>, BuildEngineError> {
    let pool_uids = Pools::uid_count(configs);
    if u64::from(first_uid) + pool_uids as u64 >= u64::from(u32::MAX - 1) {
        return Err(BuildEngineError::Invalid(format!(
            "the warm pools' {pool_uids} uids past {first_uid} do not fit in a uid: lower sandbox_uid_base or max_members"
        )));
    }
    let mut pool_list = Vec::new();
    for c in configs {
        let Some(index) = names.iter().position(|n| *n == c.provider) else {
            return Err(BuildEngineError::Invalid(format!(
                "a warm pool names `{}`, which is not configured",
                c.provider
            )));
        };
        pool_list.push((index, c.clone()));
    }
    let defaults = config.limits.defaults;
    Ok(Pools::new(
        &pool_list,
        |language| plimsoll_sandbox::WarmShape {
            language,
            memory_bytes: defaults.memory_bytes,
            pids: defaults.pids,
            disk_bytes: defaults.disk_bytes,
        },
        first_uid,
        Some(plimsoll_sandbox::lease_dir(&config.state_dir)),
        config.state_dir.join("runs"),
        config.limits.maximums.timeout,
        counts,
        config.images.clone(),
    ))
}

impl Drop for Engine {
    /// Stops the pools' keeper, destroys every idle member, and waits for the teardowns of
    /// used ones.
    fn drop(&mut self) {
        self.stop_pools();
        if !self.cold_teardowns.wait(std::time::Duration::from_secs(60)) {
            tracing::error!("cold runs' teardowns were still running after 60 s");
        }
    }
}

impl Engine {
    /// An engine over these providers. Refuses an empty list: with nothing configured,
    /// nothing runs. Providers are not probed yet; call [`Engine::probe_all`].
    pub fn new(
        config: EngineConfig,
        providers: Vec<AnyProvider>,
    ) -> Result<Self, BuildEngineError> {
        if providers.is_empty() {
            return Err(BuildEngineError::NoProviders);
        }
        validate_uid_range(
            config.sandbox_uid_base,
            config.max_concurrent,
            providers.len(),
        )?;
        if config.max_concurrent == 0 || config.max_per_caller == 0 {
            return Err(BuildEngineError::Invalid(
                "max_concurrent and max_per_caller must be at least 1".into(),
            ));
        }
        let mut names = std::collections::BTreeSet::new();
        for p in &providers {
            if !names.insert(p.name().to_owned()) {
                return Err(BuildEngineError::DuplicateName(p.name().to_owned()));
            }
        }
        let admission = Admission::with_uid_leases(
            config.max_concurrent,
            config.max_per_caller,
            plimsoll_sandbox::lease_dir(&config.state_dir),
            config.sandbox_uid_base,
        );
        let first_pool_uid = crate::admission::uid_range_end(
            config.sandbox_uid_base,
            config.max_concurrent,
            providers.len(),
        )
        .expect("validated above");
        let names: Vec<&str> = providers.iter().map(|p| p.name()).collect();
        let pool_counts = Arc::new(PoolCounts::default());
        let pools = build_pools(
            &config,
            &config.pools,
            &names,
            first_pool_uid,
            Arc::clone(&pool_counts),
        )?;
        let slots = providers
            .into_iter()
            .enumerate()
            .map(|(index, provider)| Slot {
                provider,
                probed: RwLock::new(None),
                probe_uid: crate::admission::probe_uid(
                    config.sandbox_uid_base,
                    config.max_concurrent,
                    index,
                ),
                probing: std::sync::Mutex::new(()),
                recheck: RecheckState::default(),
            })
            .collect();
        Ok(Engine {
            slots,
            admission,
            grants: RwLock::new(Arc::new(GrantProfiles::none())),
            brokers: Brokers::Here,
            cache: None,
            pools: RwLock::new(PoolSet {
                configs: config.pools.clone(),
                pools,
            }),
            keeper: std::sync::Mutex::new(Keeper::default()),
            first_pool_uid,
            pool_counts,
            cold_teardowns: Arc::default(),
            sessions: crate::session::Sessions::new(),
            config,
        })
    }

    /// The pools in force now.
    fn pools(&self) -> Arc<Pools> {
        Arc::clone(&self.pools.read().unwrap_or_else(|p| p.into_inner()).pools)
    }

    /// The warm pools' configuration in force.
    pub fn pool_configs(&self) -> Vec<PoolConfig> {
        self.pools
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .configs
            .clone()
    }

    /// Puts `configs` in force (the daemon's SIGHUP): a configuration equal to the one in
    /// force changes nothing; another is checked first (a refusal leaves the pools in force
    /// untouched), then the old pools are stopped and drained (every idle member destroyed,
    /// used ones' teardowns waited for, up to a minute) and the new ones kept from empty.
    /// Runs in flight keep the member they claimed; a uid a used member still holds is
    /// skipped by the new pools until its lease is free. Runs that arrive meanwhile start
    /// cold.
    pub fn replace_pools(
        &self,
        configs: Vec<PoolConfig>,
    ) -> Result<PoolsReplaced, BuildEngineError> {
        let mut keeper = self.keeper.lock().unwrap_or_else(|p| p.into_inner());
        if self.pool_configs() == configs {
            return Ok(PoolsReplaced::Unchanged);
        }
        let names: Vec<&str> = self.slots.iter().map(|s| s.provider.name()).collect();
        let new = build_pools(
            &self.config,
            &configs,
            &names,
            self.first_pool_uid,
            Arc::clone(&self.pool_counts),
        )?;
        let old = self.pools();
        old.stop();
        if let Some(k) = keeper.thread.take() {
            let _ = k.join();
        }
        old.drain();
        if !old.wait_for_teardowns(std::time::Duration::from_secs(60)) {
            tracing::error!("warm members' teardowns were still running after 60 s");
        }
        *self.pools.write().unwrap_or_else(|p| p.into_inner()) = PoolSet {
            configs,
            pools: new,
        };
        if keeper.wanted {
            self.spawn_keeper(&mut keeper);
        }
        Ok(PoolsReplaced::Replaced)
    }

    /// Starts keeping the warm pools (docs/warm-pools.md): a thread makes members up to each
    /// pool's minimum idle and drops stale ones, until the engine is dropped. Without this
    /// call (the CLI's one-shot engine) every run starts cold. Idempotent.
    pub fn start_pools(&self) {
        let mut keeper = self.keeper.lock().unwrap_or_else(|p| p.into_inner());
        keeper.wanted = true;
        self.spawn_keeper(&mut keeper);
    }

    /// Starts the keeper thread over the pools in force, unless one runs or there is
    /// nothing to keep.
    fn spawn_keeper(&self, keeper: &mut Keeper) {
        let pools = self.pools();
        if keeper.thread.is_some() || pools.is_empty() || pools.stopped() {
            return;
        }
        let slots = Arc::clone(&self.slots);
        let spawned = std::thread::Builder::new()
            .name("warm-pools".into())
            .spawn(move || {
                while !pools.stopped() {
                    let providers: Vec<&dyn Provider> =
                        slots.iter().map(|s| &s.provider as &dyn Provider).collect();
                    let now: Vec<ProviderNow> = slots
                        .iter()
                        .map(|s| ProviderNow {
                            evidence_sha256: s
                                .probed
                                .read()
                                .unwrap_or_else(|p| p.into_inner())
                                .as_ref()
                                .filter(|st| st.probed.available.is_ok() && !s.recheck.stale())
                                .map(|st| st.evidence_sha256.clone()),
                        })
                        .collect();
                    if !pools.keep(&providers, &now) {
                        pools.wait(std::time::Duration::from_millis(250));
                    }
                }
            });
        match spawned {
            Ok(handle) => keeper.thread = Some(handle),
            Err(e) => {
                tracing::error!(error = %e, "no thread to keep the warm pools: every run starts cold")
            }
        }
    }

    /// Stops the keeper, destroys every idle member and waits (up to a minute) for the
    /// teardowns of used ones. After this every run starts cold.
    pub fn stop_pools(&self) {
        let mut keeper = self.keeper.lock().unwrap_or_else(|p| p.into_inner());
        keeper.wanted = false;
        let pools = self.pools();
        pools.stop();
        if let Some(k) = keeper.thread.take() {
            let _ = k.join();
        }
        pools.drain();
        if !pools.wait_for_teardowns(std::time::Duration::from_secs(60)) {
            tracing::error!("warm members' teardowns were still running after 60 s");
        }
    }

    /// True when `provider` is configured here and makes warm members.
    pub fn warms(&self, provider: &str) -> bool {
        self.slots
            .iter()
            .any(|s| s.provider.name() == provider && s.provider.warms())
    }

    /// Whether the provider named `provider` keeps sessions.
    pub fn opens_sessions(&self, provider: &str) -> bool {
        self.slots
            .iter()
            .any(|s| s.provider.name() == provider && s.provider.opens_sessions())
    }

    /// The idle members of every pool now: `(provider, language, idle)`.
    pub fn pools_idle(&self) -> Vec<(String, plimsoll_wire::Language, usize)> {
        self.pools().idle()
    }

    /// The idle members every pool keeps now (`min_idle`, grown by demand): `(provider,
    /// language, wanted)`, in the order of [`Engine::pools_idle`].
    pub fn pools_wanted(&self) -> Vec<(String, plimsoll_wire::Language, usize)> {
        self.pools().wanted()
    }

    /// Whether a warm member is being made now.
    pub fn pool_making(&self) -> bool {
        self.pools().making()
    }

    /// Each idle member's provider, language and id (its id names its directory, container
    /// and cgroups).
    pub fn pool_idle_members(&self) -> Vec<(String, plimsoll_wire::Language, String, u32)> {
        self.pools().idle_ids()
    }

    /// The uids warm members may run as (past every other uid of the engine).
    pub fn pool_uid_range(&self) -> std::ops::Range<u32> {
        self.pools().uid_range()
    }

    /// The member uids held now (idle members, members being made, used members still
    /// being torn down).
    pub fn pool_uids_held(&self) -> Vec<u32> {
        self.pools().held_uids()
    }

    /// The ids of idle members and of the member being made (`warm-<hex>`: each names its
    /// member's directory, container and cgroups).
    pub fn pool_member_ids(&self) -> Vec<String> {
        self.pools().member_ids()
    }

    /// The pools' counts since the engine was built.
    pub fn pool_counts(&self) -> &PoolCounts {
        &self.pool_counts
    }

    /// Waits until every used member's background teardown has ended.
    pub fn wait_for_teardowns(&self, within: std::time::Duration) -> bool {
        let deadline = std::time::Instant::now() + within;
        self.pools().wait_for_teardowns(within)
            && self
                .cold_teardowns
                .wait(deadline.saturating_duration_since(std::time::Instant::now()))
    }

    /// Sandboxes being removed after their run was answered now: used warm members' and
    /// cold runs'.
    pub fn teardowns_running(&self) -> usize {
        self.pools().teardowns_running() + self.cold_teardowns.running()
    }

    /// Loads a grants file (docs/capability-grants.md), reading every secret it names from
    /// this process's environment now, through [`plimsoll_env::get_named_by_grants`].
    pub fn load_grants(path: &Path) -> Result<GrantProfiles, LoadGrantsError> {
        GrantProfiles::load(path, plimsoll_env::get_named_by_grants)
    }

    /// The engine with these grant profiles (by default there are none, and every request
    /// naming a grant is refused); see [`Engine::load_grants`].
    pub fn with_grants(self, grants: GrantProfiles) -> Self {
        self.replace_grants(grants);
        self
    }

    /// The engine with its runs' brokers in `brokers` (the daemon's broker process); by
    /// default they run in this process.
    pub fn with_brokers(mut self, brokers: Brokers) -> Self {
        self.brokers = brokers;
        self
    }

    /// Replaces every grant profile at once (the daemon does this on SIGHUP). Runs already
    /// dispatched keep the profile they started with; later runs see only the new set.
    pub fn replace_grants(&self, grants: GrantProfiles) {
        *self.grants.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(grants);
    }

    /// The grant profiles in force now (a snapshot: a later [`Engine::replace_grants`] does
    /// not change it).
    pub fn grants(&self) -> Arc<GrantProfiles> {
        Arc::clone(&self.grants.read().unwrap_or_else(|p| p.into_inner()))
    }

    /// The engine with an evidence cache: [`Engine::probe_for`] takes a provider's evidence
    /// from it when it still holds (see [`EvidenceCache`]) instead of probing, and stores the
    /// evidence of every probe that passed. [`Engine::probe_all`] and [`Engine::reprobe`]
    /// always probe.
    pub fn with_evidence_cache(mut self, cache: EvidenceCache) -> Self {
        self.cache = Some(cache);
        self
    }

    /// The evidence `provider` is offered on now, if it was probed (or read from the cache).
    pub fn evidence(&self, provider: &str) -> Option<ProviderEvidence> {
        let slot = self.slots.iter().find(|s| s.provider.name() == provider)?;
        let st = slot
            .probed
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()?;
        Some(ProviderEvidence {
            evidence: st.probed.evidence.clone(),
            evidence_sha256: st.evidence_sha256.clone(),
            cached: st.cached,
        })
    }

    /// The settings in force.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// Runs every provider's probe at once, each on a thread of its own and as a uid of its
    /// own, and keeps each provider's evidence as soon as its probe ends: a provider serves
    /// from then on, whatever the others' probes are doing. Returns when every probe has
    /// ended. Slow (it runs real sandboxes).
    pub fn probe_all(&self) {
        std::thread::scope(|s| {
            for slot in self.slots.iter() {
                let spawned = std::thread::Builder::new()
                    .name(format!("probe-{}", slot.provider.name()))
                    .spawn_scoped(s, || self.probe_slot(slot));
                if spawned.is_err() {
                    // No thread to be had: probe here, one after another.
                    self.probe_slot(slot);
                }
            }
        });
    }

    /// Probes only what a run with this floor and provider needs: providers that could meet
    /// the floor, cheapest first, until one is available. For one-shot use (the CLI), where
    /// probing every provider would cost seconds. When none is available, the cheapest
    /// provider overall is probed too, so a refusal can say what this host does offer.
    pub fn probe_for(
        &self,
        floor: Option<plimsoll_wire::Tier>,
        named: Option<&str>,
        spec: &plimsoll_wire::RunSpec,
    ) {
        let floor = floor.unwrap_or(self.config.default_floor);
        let mut order: Vec<&Slot> = self
            .slots
            .iter()
            .filter(|s| named.is_none_or(|n| s.provider.name() == n))
            .filter(|s| s.provider.nominal_tier() >= floor && s.provider.supports(spec).is_ok())
            .collect();
        order.sort_by_key(|s| s.provider.cost());
        for slot in order {
            if !self.adopt_cached(slot) {
                self.probe_slot(slot);
                self.store_cached(slot);
            }
            let ok = slot
                .probed
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .as_ref()
                .is_some_and(|st| st.probed.available.is_ok() && st.probed.tier >= floor);
            if ok {
                return;
            }
        }
        if let Some(cheapest) = self.slots.iter().min_by_key(|s| s.provider.cost()) {
            let probed = cheapest
                .probed
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .is_some();
            if !probed && !self.adopt_cached(cheapest) {
                self.probe_slot(cheapest);
                self.store_cached(cheapest);
            }
        }
    }

    /// Takes `slot`'s evidence from the cache, if there is one and it holds.
    fn adopt_cached(&self, slot: &Slot) -> bool {
        let Some(cache) = &self.cache else {
            return false;
        };
        let name = slot.provider.name();
        match cache
            .lookup(name, plimsoll_sandbox::unix_ms_now())
            .and_then(|evidence| {
                slot.provider
                    .adopt(&evidence)
                    .map(|()| evidence)
                    .map_err(crate::evidence_cache::CacheMiss::Provider)
            }) {
            Ok(evidence) => {
                tracing::info!(
                    provider = name,
                    checked_unix_ms = evidence.checked_unix_ms,
                    "evidence reused from the cache"
                );
                let evidence_sha256 = evidence_sha256(&evidence);
                *slot.probed.write().unwrap_or_else(|p| p.into_inner()) =
                    Some(Arc::new(ProbedState {
                        probed: Probed {
                            tier: evidence.isolation,
                            evidence,
                            available: Ok(()),
                        },
                        evidence_sha256,
                        cached: true,
                    }));
                true
            }
            Err(miss) => {
                tracing::info!(provider = name, why = %miss, "probing: cached evidence not used");
                false
            }
        }
    }

    /// Stores `slot`'s evidence in the cache when its probe passed.
    fn store_cached(&self, slot: &Slot) {
        let Some(cache) = &self.cache else {
            return;
        };
        let st = slot
            .probed
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        if let Some(st) = st
            && st.probed.available.is_ok()
            && st.probed.tier == st.probed.evidence.isolation
            && let Err(e) = cache.store(&st.probed.evidence)
        {
            tracing::warn!(provider = slot.provider.name(), error = %e, "cannot store evidence in the cache");
        }
    }

    fn probe_slot(&self, slot: &Slot) {
        probe_slot(slot, &plimsoll_sandbox::lease_dir(&self.config.state_dir));
    }

    /// Probes `slot` again off the caller's path, after a failure that says something of
    /// the provider ([`concerns_provider`]): the caller's answer does not wait for it, and
    /// the provider keeps serving on its last good evidence until the probe says otherwise.
    /// A second failure while one runs starts none.
    pub(crate) fn recheck_in_background(&self, index: usize) {
        recheck(
            &self.slots,
            index,
            plimsoll_sandbox::lease_dir(&self.config.state_dir),
            Recheck::AfterFailure,
        );
    }

    /// True while `name` is being probed again in the background after a failure.
    pub fn rechecking(&self, name: &str) -> bool {
        self.slots
            .iter()
            .any(|s| s.provider.name() == name && s.recheck.rechecking())
    }

    /// The answer to `GET /v1/providers`: the default floor and [`Engine::providers`].
    pub fn providers_response(&self) -> plimsoll_wire::ProvidersResponse {
        plimsoll_wire::ProvidersResponse {
            protocol: plimsoll_wire::PROTOCOL,
            default_floor: self.config.default_floor,
            providers: self.providers(),
            images: self.images(),
        }
    }

    /// Every configured provider, its tier, availability and evidence, cheapest first.
    pub fn providers(&self) -> Vec<ProviderInfo> {
        let mut out: Vec<(u32, ProviderInfo)> = self
            .slots
            .iter()
            .filter_map(|slot| {
                let st = slot
                    .probed
                    .read()
                    .unwrap_or_else(|p| p.into_inner())
                    .clone()?;
                let available = if slot.recheck.stale() {
                    Err(STALE.to_owned())
                } else {
                    st.probed.available.clone().map_err(|w| w.to_string())
                };
                Some((
                    slot.provider.cost(),
                    ProviderInfo {
                        name: slot.provider.name().to_owned(),
                        isolation: st.probed.tier,
                        available: available.is_ok(),
                        unavailable_reason: available.err(),
                        evidence: st.probed.evidence.clone(),
                        evidence_sha256: st.evidence_sha256.clone(),
                    },
                ))
            })
            .collect();
        out.sort_by_key(|(cost, _)| *cost);
        out.into_iter().map(|(_, info)| info).collect()
    }

    /// This engine's instance: 16 hex digits, the middle of every session id it gives. A
    /// router in front of several daemons routes a session's calls by it (docs/cluster.md).
    pub fn instance(&self) -> &str {
        self.sessions.instance()
    }

    /// Instances of earlier daemons whose saved sessions this engine restored
    /// ([`Engine::resume_sessions`]): their session ids are served here too.
    pub fn adopted_instances(&self) -> Vec<String> {
        self.sessions.adopted().into_iter().collect()
    }

    /// True once every provider's first probe has ended and at least one passed. A provider
    /// serves as soon as its own probe passed, before this (routing skips one not probed
    /// yet), but a caller that waits for readiness then sees every provider the host offers,
    /// so "the strongest available" does not depend on which probe finished first. Not
    /// before the sessions an earlier daemon saved are restored ([`Engine::resume_sessions`]).
    pub fn ready(&self) -> bool {
        if self.resuming() {
            return false;
        }
        let states: Vec<Option<bool>> = self
            .slots
            .iter()
            .map(|s| {
                s.probed
                    .read()
                    .unwrap_or_else(|p| p.into_inner())
                    .as_ref()
                    .map(|st| st.probed.available.is_ok())
            })
            .collect();
        !states.contains(&None) && states.contains(&Some(true))
    }

    /// Runs in flight now.
    pub fn in_flight(&self) -> usize {
        self.admission.in_flight()
    }

    /// Decides `req` for `caller` on one snapshot of every provider: its plan, the chosen
    /// provider's probed state and index. With `sessions`, only providers that open sessions
    /// are candidates. Refuses (nothing ran) when the floor, routing or the provider's
    /// environment says no.
    pub(crate) fn decide(
        &self,
        caller: &str,
        req: &RunRequest,
        sessions: bool,
    ) -> Result<(crate::plan::Plan, Arc<ProbedState>, usize), RunError> {
        let id = Some(req.request_id.as_str());
        // Snapshot every provider's state once, so the decision and the record agree.
        let states: Vec<Option<Arc<ProbedState>>> = self
            .slots
            .iter()
            .map(|s| s.probed.read().unwrap_or_else(|p| p.into_inner()).clone())
            .collect();
        // The image must declare every simulator the request's trial steps name: else no
        // provider could run it, and nothing is dispatched.
        let image = self.image_for(req.image.as_deref()).and_then(|i| match i {
            Some(r) => r.stored.has_simulators(&req.run).map(|()| Some(r)),
            None => Ok(None),
        });
        let language = match &req.run {
            plimsoll_wire::RunSpec::Snippet(s) => Some(s.language),
            plimsoll_wire::RunSpec::Project(_) => None,
        };
        // Each provider's answers for this run, asked at once (one round trip to the
        // launcher of a split daemon).
        let mut admissions = crate::providers::admissions(
            self.slots.iter().zip(&states).map(|(s, st)| {
                (
                    &s.provider,
                    st.as_ref().map(|st| st.evidence_sha256.as_str()),
                )
            }),
            &req.run,
            match &image {
                Ok(Some(i)) => Some(&i.run),
                _ => None,
            },
        );
        let views: Vec<ProviderView<'_>> = self
            .slots
            .iter()
            .zip(&states)
            .zip(&admissions)
            .map(|((slot, st), admission)| ProviderView {
                uses_image: slot.provider.uses_image(),
                image: match (&image, slot.provider.uses_image()) {
                    (Ok(Some(i)), uses) => admission
                        .takes_image
                        .clone()
                        .map_err(|e| e.to_string())
                        .and_then(|()| match language {
                            Some(l) if uses => i.stored.starts(l),
                            _ => Ok(()),
                        }),
                    _ => Ok(()),
                },
                name: slot.provider.name(),
                tier: st
                    .as_ref()
                    .map_or(slot.provider.nominal_tier(), |s| s.probed.tier),
                cost: slot.provider.cost(),
                supports: if sessions && !slot.provider.opens_sessions() {
                    Err(plimsoll_sandbox::Unsupported::NoSessions)
                } else {
                    admission.supports.clone()
                },
                memory_floor: admission.memory_floor,
                carries_broker: slot.provider.supports_broker(),
                carries_egress: slot.provider.supports_egress(),
                available: match st {
                    _ if slot.recheck.stale() => Err(Unavailable::Stale),
                    None => Err(Unavailable::Probing),
                    Some(s) => s
                        .probed
                        .available
                        .as_ref()
                        .map(|_| ())
                        .map_err(Unavailable::Withdrawn),
                },
            })
            .collect();
        let choice = image.map(|i| i.map(|i| i.run));
        let decided = plan(caller, req, &self.config, &self.grants(), &views, &choice)?;
        // The egress proxy inside is the agent's, which a snippet does not start.
        if !sessions
            && matches!(req.run, plimsoll_wire::RunSpec::Snippet(_))
            && decided.grant.as_ref().is_some_and(|g| g.egress().is_some())
        {
            return Err(RunError::refused(
                id,
                Reason::Unsupported,
                "an egress grant serves projects and sessions, not snippets yet: send the code as a project with one step (`python3 main.py`), or open a session with the grant",
            ));
        }
        let floor = decided.floor;
        let index = decided.provider;
        let slot = &self.slots[index];
        let chosen = slot.provider.name();
        let state = states[index].clone().expect("routed providers are probed");
        // The floor is checked once more against the exact evidence the run will carry.
        if state.probed.tier < floor {
            return Err(RunError::refused(
                id,
                Reason::Isolation,
                "the chosen provider fell below the floor",
            ));
        }
        // The evidence still names what the run would get (a rebuilt image does not): else
        // nothing runs, and the provider is probed again (routing skips it meanwhile; its
        // warm members, made under the old evidence, are dropped once the new one is in).
        // (Answered with the admission when the launcher knew the evidence.)
        let holds = admissions[index]
            .holds
            .take()
            .unwrap_or_else(|| slot.provider.environment_holds(&state.probed.evidence));
        if let Err(stale) = holds {
            tracing::warn!(provider = chosen, %stale, "the provider's environment changed since its probe; probing it again");
            recheck(
                &self.slots,
                index,
                plimsoll_sandbox::lease_dir(&self.config.state_dir),
                Recheck::Stale,
            );
            return Err(RunError::refused(
                id,
                Reason::Environment,
                format!(
                    "{chosen}'s environment changed since it was probed ({stale}): it is being probed again; retry shortly"
                ),
            ));
        }
        Ok((decided, state, index))
    }

    /// The image a request names (`None`: the default one), read from the store now, so a
    /// rebuilt or imported image is seen at once.
    fn image_for(&self, selector: Option<&str>) -> Result<Option<ResolvedImage>, String> {
        let Some(store) = &self.config.images else {
            return match selector {
                None => Ok(None),
                Some(asked) => Err(format!(
                    "no image `{asked}` here: this server keeps no image store; omit image"
                )),
            };
        };
        match store.resolve(selector) {
            Ok(stored) => Ok(Some(ResolvedImage {
                run: run_image(&stored, selector.is_some()),
                stored,
            })),
            // No default image to give: the providers use the one they were configured
            // with (and say what is missing when they cannot).
            Err(e) if selector.is_none() => {
                tracing::debug!(error = %e, "no default image in the store");
                Ok(None)
            }
            Err(e) => Err(e.to_string()),
        }
    }

    /// The images a request may name, for `GET /v1/providers`. `vm_disk` says whether the
    /// VM provider (when configured) can boot it: with its own disk, or the one its assets
    /// were made from.
    pub fn images(&self) -> Vec<plimsoll_wire::ImageInfo> {
        let Some(store) = &self.config.images else {
            return Vec::new();
        };
        let listing = match store.list() {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %plimsoll_sandbox::error_chain(&e), "cannot list the images");
                return Vec::new();
            }
        };
        let vm = self
            .slots
            .iter()
            .find(|s| s.provider.nominal_tier() == plimsoll_wire::Tier::Vm);
        listing
            .images
            .into_iter()
            .map(|i| {
                let vm_disk =
                    vm.is_some_and(|s| s.provider.takes_image(&run_image(&i, false)).is_ok());
                i.info(store, vm_disk)
            })
            .collect()
    }

    /// Makes `cancel` kill the processes of `sandbox`, on the provider of slot `index`, from
    /// now on (a dispatched run's own sandbox or its warm member's; a session's, for a call
    /// in it). Disarm it once the run or call is over.
    pub(crate) fn arm_cancel(&self, cancel: &crate::Cancel, index: usize, sandbox: RunningIn) {
        let slots = Arc::clone(&self.slots);
        cancel.arm(Box::new(move || {
            if let Err(e) = slots[index].provider.cancel(&sandbox) {
                tracing::warn!(error = %plimsoll_sandbox::error_chain(&e), "cannot end a cancelled run's processes");
            }
        }));
    }

    /// Runs one request for `caller`. Blocks until the run is over. Every refusal comes
    /// before anything starts and carries its reason.
    pub fn run(&self, caller: &str, req: &RunRequest) -> Result<RunResponse, RunError> {
        self.run_with(caller, req, crate::RunHooks::default())
    }

    /// [`Engine::run`], with its output also handed to `hooks.tap` as it is read, and ended
    /// early when `hooks.cancel` is cancelled (refused, not dispatched, if that came first).
    pub fn run_with(
        &self,
        caller: &str,
        req: &RunRequest,
        hooks: crate::RunHooks,
    ) -> Result<RunResponse, RunError> {
        let id = Some(req.request_id.as_str());
        let (decided, state, index) = self.decide(caller, req, false)?;
        let floor = decided.floor;
        let slot = &self.slots[index];
        let chosen = slot.provider.name();

        let permit = self
            .admission
            .try_admit(caller)
            .map_err(|m| RunError::refused(id, Reason::Capacity, m))?;
        let run_id = new_run_id();
        // The run's broker: mints its credential now, lives as long as the run.
        let broker = decided
            .grant
            .clone()
            .map(|p| {
                self.brokers
                    .start(p, caller, &run_id, decided.limits.timeout)
            })
            .transpose()
            .map_err(|e| RunError::refused(id, Reason::Environment, broker_unavailable(&e)))?;
        let mut plan = decided.launch(
            req,
            &self.config,
            permit.slot(),
            &run_id,
            broker.as_ref().map(|b| b.channel()),
        );
        plan.tap = hooks.tap.clone();
        // Kills the processes of the sandbox the run runs in (its own, or its warm
        // member's), by the provider's own means.
        let arm = |sandbox: RunningIn| {
            if let Some(c) = &hooks.cancel {
                self.arm_cancel(c, index, sandbox);
            }
        };
        let cancelled = || hooks.cancel.as_ref().is_some_and(|c| c.is_cancelled());
        if hooks.cancel.as_ref().is_some_and(|c| c.is_cancelled()) {
            return Err(RunError::refused(
                id,
                Reason::Request,
                "the run was cancelled (its client went away) before it was dispatched",
            ));
        }
        // A warm member when a pool matches exactly and has one made under this evidence.
        // Keyed on the resolved plan, not the request.
        let claimed = self.pools().claim(index, &plan, &state.evidence_sha256);
        tracing::info!(
            request_id = %req.request_id, run_id = %run_id, caller, provider = chosen,
            tier = %state.probed.tier, grant = req.grant.as_deref().unwrap_or("-"),
            start = if claimed.is_some() { "warm" } else { "cold" }, "dispatching"
        );
        // A cold run's removal, when its provider leaves it for after the answer.
        let mut teardown = None;
        let mut cold = |plan: &plimsoll_sandbox::LaunchPlan| {
            arm(RunningIn::made_for(plan));
            slot.provider.run_then_tear_down(plan).map(|(o, t)| {
                teardown = t;
                o
            })
        };
        let (outcome, member_age) = match claimed {
            Some(member) => {
                let age = member.age;
                let cold_plan = plan.clone();
                plan.uid = member.uid();
                plan.gid = member.uid();
                arm(member.sandbox());
                match member.run(&plan) {
                    // A member that could not take the run ran nothing: the run starts cold,
                    // unless its client went away meanwhile.
                    Err(e) if e.not_dispatched().is_some() && !cancelled() => {
                        tracing::warn!(request_id = %req.request_id, provider = chosen, error = %e.message(), "a warm member could not take the run; starting it cold");
                        (cold(&cold_plan), None)
                    }
                    other => (other, Some(age)),
                }
            }
            None => (cold(&plan), None),
        };
        if let Some(c) = &hooks.cancel {
            c.disarm();
        }
        // The sandbox's processes are gone: close the channel and collect the calls it made.
        let finished = broker.map(|b| b.finish()).unwrap_or_default();
        // The caller's place is free now; the run's uids only once what is left of its
        // sandbox has been removed, after the answer.
        let permit = permit.answered();
        match teardown {
            Some(t) => {
                let run = run_id.clone();
                let slots = Arc::clone(&self.slots);
                let lease_dir = plimsoll_sandbox::lease_dir(&self.config.state_dir);
                self.cold_teardowns.spawn("cold-teardown", t, move |ended| {
                    // As a run whose cleanup failed before its answer: logged, and the
                    // provider probed again (serving on its last good evidence meanwhile).
                    if let Err(e) = ended {
                        tracing::error!(run_id = %run, error = %plimsoll_sandbox::error_chain(e.as_ref()), "a run's sandbox was not fully removed after its answer");
                        recheck(&slots, index, lease_dir, Recheck::AfterFailure);
                    }
                    drop(permit);
                });
            }
            None => drop(permit),
        }
        // A run whose client went away before its answer ends as cancelled, however its
        // sandbox ended (killed, or failing because it was): one outcome, never the
        // provider's failure, and no re-check of it unless what was left of the sandbox
        // could not be removed.
        if cancelled() {
            let ended = match &outcome {
                Ok(_) => "with a result".to_owned(),
                Err(e) => e.message(),
            };
            tracing::info!(request_id = %req.request_id, provider = chosen, %ended, "run cancelled: its client went away");
            if let Err(e) = &outcome
                && e.cleanup().is_some()
            {
                self.recheck_in_background(index);
            }
            return Err(match outcome {
                Err(e) if e.not_dispatched().is_some() => RunError::refused(
                    id,
                    Reason::Request,
                    "the run was cancelled (its client went away) before its code started",
                ),
                _ => RunError::Cancelled {
                    request_id: req.request_id.clone(),
                    provider: chosen.to_owned(),
                },
            });
        }
        let mut outcome = match outcome {
            Ok(o) => o,
            Err(e) => {
                let message = e.message();
                if concerns_provider(&e) {
                    self.recheck_in_background(index);
                }
                return Err(match e.not_dispatched() {
                    Some(reason) => {
                        tracing::warn!(request_id = %req.request_id, provider = chosen, %message, "launch failed before start");
                        RunError::refused(id, reason, message)
                    }
                    None => {
                        tracing::error!(request_id = %req.request_id, provider = chosen, %message, "run failed");
                        RunError::Failed {
                            request_id: req.request_id.clone(),
                            provider: chosen.to_owned(),
                            message,
                        }
                    }
                });
            }
        };

        finish_result(&mut outcome.result, finished, member_age);
        let request_sha = request_sha256(req);
        let result_sha = result_sha256(&outcome.result);
        let mut record = RunRecord {
            image: plan.image.as_ref().map(RunImage::reference),
            trials: trials_of(&req.run, &outcome.result),
            request_id: req.request_id.clone(),
            request_sha256: request_sha.clone(),
            result_sha256: result_sha.clone(),
            provider: chosen.to_owned(),
            isolation: state.probed.tier,
            minimum_isolation: Some(floor),
            evidence_sha256: state.evidence_sha256.clone(),
            environment: environment_of(plan.image.as_ref(), &state.probed.evidence),
            started_unix_ms: outcome.started_unix_ms,
            ended_unix_ms: outcome.ended_unix_ms,
            record_sha256: String::new(),
            session: None,
        };
        record.record_sha256 = record_sha256(&record);
        tracing::info!(
            request_id = %req.request_id, provider = chosen, exit_code = ?outcome.result.exit_code,
            timed_out = outcome.result.timed_out, "run complete"
        );
        Ok(RunResponse {
            protocol: PROTOCOL,
            request_id: req.request_id.clone(),
            provider: chosen.to_owned(),
            isolation: state.probed.tier,
            duration_ms: outcome
                .ended_unix_ms
                .saturating_sub(outcome.started_unix_ms),
            request_sha256: request_sha,
            result_sha256: result_sha,
            result: outcome.result,
            record,
        })
    }
}

/// An image as the engine resolved it: what the plan carries, and what the store said of it.
#[derive(Debug, Clone)]
pub(crate) struct ResolvedImage {
    pub(crate) run: RunImage,
    pub(crate) stored: plimsoll_image::StoredImage,
}

/// What a plan carries of an image of the store; `named`: the request named it.
pub(crate) fn run_image(stored: &plimsoll_image::StoredImage, named: bool) -> RunImage {
    RunImage {
        name: stored.name().to_owned(),
        identity: stored.identity.clone(),
        rootfs: stored.at.rootfs(),
        disk: stored.disk.clone(),
        named,
    }
}

/// What the record says of each trial step that ran and printed a verdict: the verdict's last
/// line on the step's stdout, which only the trial runner writes (the controller's output
/// goes to the runner). A step without one (the runner refused to start, or failed: its
/// stderr says why), or with output cut at the limit, is left out; its result still is in
/// the result.
pub(crate) fn trials_of(
    spec: &plimsoll_wire::RunSpec,
    result: &plimsoll_wire::RunResult,
) -> Vec<plimsoll_wire::TrialStepRecord> {
    let plimsoll_wire::RunSpec::Project(project) = spec else {
        return Vec::new();
    };
    project
        .steps
        .iter()
        .zip(&result.steps)
        .enumerate()
        .filter(|(_, (step, ran))| {
            !ran.stdout_truncated
                && matches!(plimsoll_wire::trial_step::trial_step(step), Some(Ok(_)))
        })
        .filter_map(|(i, (_, ran))| {
            let out = ran.stdout.as_slice();
            let line = out
                .strip_suffix(b"\n")
                .unwrap_or(out)
                .rsplit(|&b| b == b'\n')
                .next()?;
            match plimsoll_wire::TrialStepRecord::from_verdict(u32::try_from(i).ok()?, line) {
                Ok(t) => Some(t),
                Err(e) => {
                    tracing::debug!(step = i, error = %e, "a trial step printed no verdict");
                    None
                }
            }
        })
        .collect()
}

/// What a record names as the run's environment: the identity of the image it ran in, or
/// the provider's own (the engine version at the process tier; the configured image's
/// identity when no image was resolved).
pub(crate) fn environment_of(
    image: Option<&RunImage>,
    evidence: &plimsoll_wire::Evidence,
) -> String {
    image.map_or_else(|| evidence.environment.clone(), |i| i.identity.clone())
}

/// Whether a run's failure says something about its provider, so that the provider is
/// probed again: its sandbox could not be set up (`environment`, nothing ran), or what was
/// left of it could not be removed. A failure after the code had its sandbox does not, on
/// its own: the code may have caused it (it can kill its own agent or interpreter), and a
/// provider that really broke fails the next run's setup or cleanup, which does. A request
/// that cannot run is refused before it is dispatched (`RunRequest::validate`, `plan()`),
/// never left to fail inside.
pub(crate) fn concerns_provider(e: &plimsoll_sandbox::LaunchError) -> bool {
    e.cleanup().is_some() || e.not_dispatched() == Some(Reason::Environment)
}

/// [`Engine::recheck_in_background`], for a caller holding only the slots.
fn recheck(slots: &Arc<[Slot]>, index: usize, lease_dir: std::path::PathBuf, why: Recheck) {
    let slot = &slots[index];
    if !slot.recheck.begin(why) {
        return;
    }
    let ended = |slot: &Slot| slot.recheck.ended();
    let theirs = Arc::clone(slots);
    let their_dir = lease_dir.clone();
    let spawned = std::thread::Builder::new()
        .name(format!("recheck-{}", slot.provider.name()))
        .spawn(move || {
            let slot = &theirs[index];
            probe_slot(slot, &their_dir);
            ended(slot);
        });
    if let Err(e) = spawned {
        // No thread to be had: probe here; this caller waits, but the provider comes back.
        tracing::warn!(provider = slot.provider.name(), error = %e, "no thread for the re-check: probing on the caller's path");
        probe_slot(slot, &lease_dir);
        ended(slot);
    }
}

/// Probes `slot` as its own probe uid, leased host-wide from `lease_dir`, and keeps what it
/// found.
fn probe_slot(slot: &Slot, lease_dir: &Path) {
    let _one_at_a_time = slot.probing.lock().unwrap_or_else(|p| p.into_inner());
    // The provider's probe uid is leased host-wide too, so another engine with the same
    // uid base never probes as it at the same moment.
    let probe_uid = slot.probe_uid;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let lease = loop {
        match plimsoll_sandbox::try_lease(lease_dir, probe_uid) {
            Ok(Some(lease)) => break Ok(lease),
            Ok(None) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            Ok(None) => {
                break Err(format!(
                    "the probe uid {probe_uid} is still held by another plimsoll engine after 120 s: give each engine its own sandbox_uid_base"
                ));
            }
            Err(e) => break Err(format!("cannot lease the probe uid {probe_uid}: {e}")),
        }
    };
    // Probing as a uid another engine is using would let each kill the other's
    // processes, so without the lease the provider is withdrawn instead.
    let probed = match &lease {
        Ok(_) => slot.provider.probe(),
        Err(why) => unprobed(
            slot.provider.name(),
            slot.provider.nominal_tier(),
            why.clone(),
        ),
    };
    match &probed.available {
        Ok(()) => {
            tracing::info!(provider = slot.provider.name(), tier = %probed.tier, "provider available")
        }
        Err(why) => {
            tracing::warn!(provider = slot.provider.name(), reason = %why, "provider withdrawn")
        }
    }
    let evidence_sha256 = evidence_sha256(&probed.evidence);
    *slot.probed.write().unwrap_or_else(|p| p.into_inner()) = Some(Arc::new(ProbedState {
        probed,
        evidence_sha256,
        cached: false,
    }));
}

/// The state of a provider whose probe could not run: withdrawn, with the reason as evidence.
fn unprobed(name: &str, tier: plimsoll_wire::Tier, why: String) -> Probed {
    Probed {
        tier,
        evidence: plimsoll_wire::Evidence {
            provider: name.to_owned(),
            isolation: tier,
            config: Default::default(),
            binaries: Vec::new(),
            probe: None,
            checks: [("probe".to_owned(), why.clone())].into(),
            environment: String::new(),
            checked_unix_ms: plimsoll_sandbox::unix_ms_now(),
        },
        available: Err(plimsoll_sandbox::Withdrawn::NotProbed(why)),
    }
}

/// Completes a dispatched run's result before its digest is taken: the calls and egress
/// receipts its broker saw, and how its sandbox started (warm with the member's age, or
/// cold), whatever the provider wrote.
fn finish_result(
    result: &mut RunResult,
    finished: Finished,
    member_age: Option<std::time::Duration>,
) {
    result.calls = finished.calls;
    result.egress = finished.egress;
    result.start = Some(if member_age.is_some() {
        Start::Warm
    } else {
        Start::Cold
    });
    result.member_age_ms = member_age.map(|a| u64::try_from(a.as_millis()).unwrap_or(u64::MAX));
}

/// A run refused because the broker process could not take its grant: nothing ran.
pub(crate) fn broker_unavailable(e: &std::io::Error) -> String {
    format!(
        "the broker process could not take this run's grant ({e}); nothing ran: try again, and see the daemon's log if it persists"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_finished_result_says_its_sandbox_started_cold_and_the_digest_covers_it() {
        // What a provider hands back says nothing of how the sandbox started (or says it
        // wrongly): the engine decides.
        for (start, member_age_ms) in [(None, None), (Some(Start::Warm), Some(5))] {
            let mut result = RunResult {
                exit_code: Some(0),
                start,
                member_age_ms,
                ..RunResult::default()
            };
            let call = plimsoll_wire::GrantCall {
                method: "GET".into(),
                route: None,
                status: Some(200),
                error: None,
                request_bytes: 0,
                response_bytes: 2,
                latency_ms: 1,
                credential: None,
            };
            let finished = Finished {
                calls: vec![call.clone()],
                egress: Vec::new(),
            };
            finish_result(&mut result, finished, None);
            assert_eq!(result.start, Some(Start::Cold));
            assert_eq!(result.member_age_ms, None);
            assert_eq!(result.calls, vec![call]);
            assert_eq!(result.validate(), Ok(()));
            let mut warm = result.clone();
            finish_result(
                &mut warm,
                Finished::default(),
                Some(std::time::Duration::from_millis(1234)),
            );
            assert_eq!(
                (warm.start, warm.member_age_ms),
                (Some(Start::Warm), Some(1234))
            );
            assert_eq!(warm.validate(), Ok(()));
            assert_ne!(result_sha256(&warm), result_sha256(&result));
            let mut no_start = result.clone();
            no_start.start = None;
            assert_ne!(
                result_sha256(&no_start),
                result_sha256(&result),
                "the start is covered by the result digest"
            );
        }
    }

    /// #28 (13): a provider is checked again only for a failure that says something about
    /// it: its sandbox could not be set up, or not removed. What the request or its code
    /// brought about (a refusal of its own, a failure once the code had the sandbox) does
    /// not take it through a re-check.
    #[test]
    fn only_a_failure_of_the_provider_s_own_checks_it_again() {
        use plimsoll_sandbox::LaunchError;
        assert!(concerns_provider(&LaunchError::environment(
            "cannot create the container"
        )));
        assert!(concerns_provider(
            &LaunchError::may_have_run("the agent died").with_cleanup("cannot remove the cgroup")
        ));
        assert!(concerns_provider(
            &LaunchError::not_started(Reason::Request, "x").with_cleanup("cannot remove /run/x")
        ));
        assert!(!concerns_provider(&LaunchError::may_have_run(
            "the agent could not do the job (exit 1): nul byte found in provided data"
        )));
        for reason in [Reason::Request, Reason::Unsupported, Reason::Capacity] {
            assert!(
                !concerns_provider(&LaunchError::not_started(reason, "x")),
                "{reason}"
            );
        }
    }
}
