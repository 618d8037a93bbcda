//! Warm pools: members made ahead of requests, one pool per provider and language
//! (docs/warm-pools.md). A member is a fresh sandbox whose interpreter waits for its code; a
//! claim gives it exactly one run, after which it is destroyed off the answer's path and
//! never returns. A pool's key is exact: the provider, the language, the fixed limits
//! (memory, pids, disk: the operator's defaults) and the provider's evidence digest when the
//! member was made. A run that matches no pool, or finds it empty, runs cold.
//!
//! One thread per engine keeps the pools: it makes members up to each pool's minimum idle
//! (one at a time, backing off after failures), and drops members older than the maximum
//! age, made under evidence the provider no longer has, or of a provider not taking runs.
//! Dropping the engine drains every pool. Members live under the state directory like runs,
//! so the start-up reap of a daemon that crashed removes them like runs.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use plimsoll_sandbox::{
    LaunchPlan, Provider, Teardown, UidLease, WarmMember, WarmPlan, WarmShape, error_chain,
    try_lease,
};
use plimsoll_wire::{Language, RunSpec};

/// A pool's settings (`[pools.<provider>.<language>]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolSettings {
    /// Members kept idle and waiting.
    pub min_idle: usize,
    /// Members at most at once, idle or being made (the uids the pool reserves).
    pub max_members: usize,
    /// An idle member older than this is destroyed and replaced.
    pub max_age: Duration,
    /// A pool that grew past `min_idle` (claims outpaced its refill) shrinks back by one
    /// member after this long without a claim.
    pub shrink_after: Duration,
}

impl Default for PoolSettings {
    fn default() -> Self {
        PoolSettings {
            min_idle: 1,
            max_members: 2,
            max_age: Duration::from_secs(300),
            shrink_after: Duration::from_secs(30),
        }
    }
}

/// One pool as configured: which provider (by name) and language.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolConfig {
    /// The provider's name.
    pub provider: String,
    /// The interpreter its members wait in.
    pub language: Language,
    /// How many, how old.
    pub settings: PoolSettings,
    /// The image its members run in, by name (`[pools.<provider>.<language>] images`);
    /// `None`: the default image. Runs in that image claim them, and only those.
    pub image: Option<String>,
}

/// What a pool's provider looks like to the keeper now.
#[derive(Debug, Clone)]
pub(crate) struct ProviderNow {
    /// Its evidence digest, when it takes runs now (probed, available, its environment not
    /// seen to have moved since).
    pub evidence_sha256: Option<String>,
}

/// One idle member, with what it was made under.
#[derive(Debug)]
pub(crate) struct Idle {
    member: Box<dyn WarmMember>,
    id: String,
    slot: usize,
    lease: Option<UidLease>,
    evidence_sha256: String,
    /// The identity of the image it runs in.
    image: Option<String>,
    made: Instant,
}

/// A member taken for a run: give it its run with [`Claimed::run`].
#[derive(Debug)]
pub(crate) struct Claimed {
    idle: Idle,
    pools: Arc<Pools>,
    /// How long it waited between being ready and being claimed.
    pub age: Duration,
}

impl Claimed {
    /// The uid the run must be planned with.
    pub fn uid(&self) -> u32 {
        self.idle.member.uid()
    }

    /// The sandbox the run will run in: the member's own (its id names its container and
    /// cgroups), which a cancellation must kill, not the run id's.
    pub fn sandbox(&self) -> plimsoll_sandbox::RunningIn {
        plimsoll_sandbox::RunningIn {
            id: self.idle.id.clone(),
            uid: self.uid(),
        }
    }

    /// The member's one run; its removal goes on in the background, and its uid is free
    /// again only once that has ended.
    pub fn run(
        self,
        plan: &LaunchPlan,
    ) -> Result<plimsoll_sandbox::Outcome, plimsoll_sandbox::LaunchError> {
        let Claimed { idle, pools, .. } = self;
        let Idle {
            member,
            slot,
            lease,
            ..
        } = idle;
        match member.run(plan) {
            Ok((outcome, teardown)) => {
                pools.tear_down_later(teardown, slot, lease);
                Ok(outcome)
            }
            Err(e) => {
                drop(lease);
                pools.free_slot(slot);
                Err(e)
            }
        }
    }
}

#[derive(Debug)]
struct Pool {
    provider: usize,
    provider_name: String,
    /// The image its members run in, by name; `None`: the default image.
    image: Option<String>,
    shape: WarmShape,
    settings: PoolSettings,
    idle: Mutex<VecDeque<Idle>>,
    /// Consecutive failures to make a member, and when to try again.
    backoff: Mutex<(u32, Option<Instant>)>,
    /// The idle members it keeps now: `min_idle`, grown by one (up to `max_members`) each
    /// time a claim finds it empty or empties it, shrunk by one after each `shrink_after`
    /// without a claim; and when the last claim came.
    demand: Mutex<(usize, Instant)>,
}

impl Pool {
    /// A claim came (whether it found a member or not); with `grow`, one more idle member
    /// is kept from now on, up to `max_members`.
    fn claimed(&self, grow: bool) {
        let mut d = self.demand.lock().unwrap_or_else(|e| e.into_inner());
        if grow {
            d.0 = (d.0 + 1).min(self.settings.max_members);
        }
        d.1 = Instant::now();
    }

    /// The idle members to keep now, after shrinking by one for each `shrink_after` that
    /// passed without a claim (never below `min_idle`).
    fn wanted(&self) -> usize {
        let floor = self.settings.min_idle.min(self.settings.max_members);
        let mut d = self.demand.lock().unwrap_or_else(|e| e.into_inner());
        if d.0 > floor && d.1.elapsed() >= self.settings.shrink_after {
            d.0 -= 1;
            d.1 = Instant::now();
        }
        d.0
    }

    /// The idle members it keeps now, as [`Pool::wanted`] last left it (no shrinking here).
    fn wanted_now(&self) -> usize {
        self.demand.lock().unwrap_or_else(|e| e.into_inner()).0
    }
}

/// Counts, for the metrics and tests.
#[derive(Debug, Default)]
pub struct PoolCounts {
    /// Members made and waiting at some point.
    pub made: AtomicU64,
    /// Members claimed by a run.
    pub claimed: AtomicU64,
    /// Runs that matched a pool but found it empty, and ran cold.
    pub empty: AtomicU64,
    /// Members destroyed unclaimed (too old, stale evidence, shutdown).
    pub discarded: AtomicU64,
    /// Attempts to make a member that failed.
    pub failed: AtomicU64,
}

/// Every pool of one engine.
#[derive(Debug)]
pub(crate) struct Pools {
    pools: Vec<Pool>,
    /// `slots[i]` is true while pool uid `first_uid + i` is held by a member.
    slots: Mutex<Vec<bool>>,
    first_uid: u32,
    lease_dir: Option<PathBuf>,
    runs_dir: PathBuf,
    max_timeout: Duration,
    stop: AtomicBool,
    wake: (Mutex<u64>, Condvar),
    pub counts: Arc<PoolCounts>,
    /// Teardowns still running in the background.
    tearing: Arc<Teardowns>,
    /// The id of the member being made, while it is.
    making: Mutex<Option<String>>,
    /// Where members' image comes from: the store's default image, read again at every
    /// round, so a rebuilt or removed image drains its members.
    images: Option<plimsoll_image::ImageStore>,
}

/// How long after `failures` consecutive failures a pool tries again: 100 ms doubling, at
/// most a minute.
pub(crate) fn backoff(failures: u32) -> Duration {
    let ms = 100u64.saturating_mul(1 << failures.min(10));
    Duration::from_millis(ms.min(60_000))
}

impl Pools {
    /// Pools for `configs`, each at `providers[i]` by name; `shape_of` gives each language's
    /// fixed limits. Member uids are `first_uid..first_uid + Σ max_members`. Members of a
    /// provider with images run in `images`' default image.
    #[expect(
        clippy::too_many_arguments,
        reason = "each is one fact the engine decided; a struct made for this one call adds nothing"
    )]
    pub fn new(
        configs: &[(usize, PoolConfig)],
        shape_of: impl Fn(Language) -> WarmShape,
        first_uid: u32,
        lease_dir: Option<PathBuf>,
        runs_dir: PathBuf,
        max_timeout: Duration,
        counts: Arc<PoolCounts>,
        images: Option<plimsoll_image::ImageStore>,
    ) -> Arc<Pools> {
        let pools: Vec<Pool> = configs
            .iter()
            .map(|(provider, c)| Pool {
                provider: *provider,
                provider_name: c.provider.clone(),
                image: c.image.clone(),
                shape: shape_of(c.language),
                settings: c.settings,
                idle: Mutex::new(VecDeque::new()),
                backoff: Mutex::new((0, None)),
                demand: Mutex::new((
                    c.settings.min_idle.min(c.settings.max_members),
                    Instant::now(),
                )),
            })
            .collect();
        let total = pools.iter().map(|p| p.settings.max_members).sum();
        Arc::new(Pools {
            pools,
            slots: Mutex::new(vec![false; total]),
            first_uid,
            lease_dir,
            runs_dir,
            max_timeout,
            stop: AtomicBool::new(false),
            wake: (Mutex::new(0), Condvar::new()),
            counts,
            tearing: Arc::new(Teardowns::default()),
            making: Mutex::new(None),
            images,
        })
    }

    /// The number of uids the pools reserve.
    pub fn uid_count(configs: &[PoolConfig]) -> usize {
        configs.iter().map(|c| c.settings.max_members).sum()
    }

    /// The uids members may run as.
    pub fn uid_range(&self) -> std::ops::Range<u32> {
        let n = self.slots.lock().unwrap_or_else(|e| e.into_inner()).len() as u32;
        self.first_uid..self.first_uid + n
    }

    /// The uids held now: by idle members, members being made, and used members whose
    /// teardown has not ended.
    pub fn held_uids(&self) -> Vec<u32> {
        let slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        (0..slots.len())
            .filter(|i| slots[*i])
            .map(|i| self.first_uid + i as u32)
            .collect()
    }

    /// The ids of idle members and of the member being made (each names the member's
    /// directory, container and cgroups: `warm-<hex>`).
    pub fn member_ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self
            .making
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .cloned()
            .collect();
        for pool in &self.pools {
            let idle = pool.idle.lock().unwrap_or_else(|e| e.into_inner());
            ids.extend(idle.iter().map(|m| m.id.clone()));
        }
        ids
    }

    /// True when no pool is configured.
    pub fn is_empty(&self) -> bool {
        self.pools.is_empty()
    }

    /// Each idle member's provider, language, id and uid.
    pub fn idle_ids(&self) -> Vec<(String, Language, String, u32)> {
        let mut out = Vec::new();
        for p in &self.pools {
            let idle = p.idle.lock().unwrap_or_else(|e| e.into_inner());
            out.extend(idle.iter().map(|m| {
                (
                    p.provider_name.clone(),
                    p.shape.language,
                    m.id.clone(),
                    m.member.uid(),
                )
            }));
        }
        out
    }

    /// The idle members each pool keeps now (`min_idle`, grown by demand): `(provider,
    /// language, wanted)`, in the order of [`Pools::idle`].
    pub fn wanted(&self) -> Vec<(String, Language, usize)> {
        self.pools
            .iter()
            .map(|p| (p.provider_name.clone(), p.shape.language, p.wanted_now()))
            .collect()
    }

    /// Whether a member is being made now.
    pub fn making(&self) -> bool {
        self.making
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }

    /// Idle members per pool: `(provider, language, idle)`.
    pub fn idle(&self) -> Vec<(String, Language, usize)> {
        self.pools
            .iter()
            .map(|p| {
                (
                    p.provider_name.clone(),
                    p.shape.language,
                    p.idle.lock().unwrap_or_else(|e| e.into_inner()).len(),
                )
            })
            .collect()
    }

    /// Takes an idle member for the run `plan` resolved at `provider` (its decided provider,
    /// language and limits), made under `evidence_sha256`, if a pool matches and has one. A
    /// match with none counts as empty. Only a plain snippet claims one: no broker channel,
    /// no trial privileges.
    pub fn claim(
        self: &Arc<Self>,
        provider: usize,
        plan: &plimsoll_sandbox::LaunchPlan,
        evidence_sha256: &str,
    ) -> Option<Claimed> {
        let RunSpec::Snippet(snippet) = &plan.spec else {
            return None;
        };
        let limits = &plan.limits;
        let plain = plan.broker.is_none() && !plan.privileges.is_trial();
        if !plain || limits.timeout > self.max_timeout {
            return None;
        }
        let shape = WarmShape {
            language: snippet.language,
            memory_bytes: limits.memory_bytes,
            pids: limits.pids,
            disk_bytes: limits.disk_bytes,
        };
        // The pools of its provider and shape that keep its image (by name: a pool naming
        // none keeps the default image, or none at a provider without images); a member is
        // also keyed on the image's identity, so one made before a rebuild is never claimed.
        let default = self.images.as_ref().map(|s| s.default_name());
        let keeps = |p: &Pool| match &plan.image {
            None => p.image.is_none(),
            Some(i) => p.image.as_deref().or(default) == Some(i.name.as_str()),
        };
        let pools: Vec<&Pool> = self
            .pools
            .iter()
            .filter(|p| p.provider == provider && p.shape == shape && keeps(p))
            .collect();
        if pools.is_empty() {
            return None;
        }
        let identity = plan.image.as_ref().map(|i| i.identity.as_str());
        let taken = pools.into_iter().find_map(|pool| {
            let mut idle = pool.idle.lock().unwrap_or_else(|e| e.into_inner());
            // The newest member made under this evidence and image; an older one under
            // other evidence or another image is left for the keeper to destroy.
            let at = idle.iter().position(|m| {
                m.evidence_sha256 == evidence_sha256 && m.image.as_deref() == identity
            });
            let taken = at.and_then(|i| idle.remove(i));
            // Claims outpace the refill when this one found the pool empty or emptied it:
            // the pool keeps one more idle member, up to its maximum.
            pool.claimed(idle.is_empty());
            taken
        });
        // The keeper is woken when the run has ended (its uid is freed), not now: a member
        // made while the run runs would take the cores the run needs.
        match taken {
            Some(idle) => {
                self.counts.claimed.fetch_add(1, Ordering::SeqCst);
                Some(Claimed {
                    age: idle.made.elapsed(),
                    idle,
                    pools: Arc::clone(self),
                })
            }
            None => {
                self.counts.empty.fetch_add(1, Ordering::SeqCst);
                self.nudge();
                None
            }
        }
    }

    fn nudge(&self) {
        let (lock, cv) = &self.wake;
        *lock.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        cv.notify_all();
    }

    fn free_slot(&self, slot: usize) {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())[slot] = false;
        self.nudge();
    }

    fn tear_down_later(self: &Arc<Self>, teardown: Teardown, slot: usize, lease: Option<UidLease>) {
        let pools = Arc::clone(self);
        self.tearing.spawn("warm-teardown", teardown, move |ended| {
            if let Err(e) = ended {
                tracing::error!(error = %error_chain(e.as_ref()), "a used warm member was not fully removed");
            }
            drop(lease);
            pools.free_slot(slot);
        });
    }

    /// Waits until every background teardown has ended (at shutdown, and for tests).
    pub fn wait_for_teardowns(&self, within: Duration) -> bool {
        self.tearing.wait(within)
    }

    /// Used members' teardowns running now.
    pub fn teardowns_running(&self) -> usize {
        self.tearing.running()
    }

    /// A free pool uid slot and its host-wide lease.
    fn take_slot(&self) -> Option<(usize, Option<UidLease>)> {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        for i in (0..slots.len()).filter(|i| !slots[*i]) {
            let lease = match &self.lease_dir {
                None => None,
                Some(dir) => match try_lease(dir, self.first_uid + i as u32) {
                    Ok(Some(l)) => Some(l),
                    Ok(None) => continue,
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot lease a warm member's uid");
                        continue;
                    }
                },
            };
            slots[i] = true;
            return Some((i, lease));
        }
        None
    }

    /// One round of the keeper: drop what must go, make one member where one is missing.
    /// Returns true when it made or dropped something (so it goes round again at once).
    pub fn keep(&self, providers: &[&dyn Provider], now: &[ProviderNow]) -> bool {
        let mut acted = false;
        for pool in &self.pools {
            let current = now[pool.provider].evidence_sha256.as_deref();
            // The pool's image as it is now (a rebuild changes its identity, a removal
            // leaves none): members of another drain.
            let image = self
                .images
                .as_ref()
                .filter(|_| providers[pool.provider].uses_image())
                .and_then(|store| store.resolve(pool.image.as_deref()).ok())
                .map(|stored| crate::engine::run_image(&stored, pool.image.is_some()));
            let image = image.as_ref();
            // An image the store does not have (yet, or any more) keeps no member.
            let missing =
                image.is_none() && self.images.is_some() && providers[pool.provider].uses_image();
            let image_identity = image.map(|i| i.identity.as_str());
            let gone: Vec<Idle> = {
                let mut idle = pool.idle.lock().unwrap_or_else(|e| e.into_inner());
                let (keep, gone): (VecDeque<Idle>, VecDeque<Idle>) =
                    idle.drain(..).partition(|m| {
                        !missing
                            && Some(m.evidence_sha256.as_str()) == current
                            && m.image.as_deref() == image_identity
                            && m.made.elapsed() < pool.settings.max_age
                    });
                *idle = keep;
                gone.into()
            };
            for m in gone {
                acted = true;
                self.discard(m);
            }
            if self.stop.load(Ordering::SeqCst) {
                return acted;
            }
            if missing {
                continue;
            }
            let Some(evidence) = current else { continue };
            let want = pool.wanted();
            let surplus = {
                let mut idle = pool.idle.lock().unwrap_or_else(|e| e.into_inner());
                // Shrunk back: the oldest members beyond what it keeps now go.
                let over = idle.len().saturating_sub(want);
                idle.drain(..over).collect::<Vec<Idle>>()
            };
            for m in surplus {
                acted = true;
                self.discard(m);
            }
            let idle_now = pool.idle.lock().unwrap_or_else(|e| e.into_inner()).len();
            if idle_now >= want {
                continue;
            }
            {
                let b = pool.backoff.lock().unwrap_or_else(|e| e.into_inner());
                if b.1.is_some_and(|t| Instant::now() < t) {
                    continue;
                }
            }
            let Some((slot, lease)) = self.take_slot() else {
                continue;
            };
            let uid = self.first_uid + slot as u32;
            let member_id = format!("warm-{}", crate::ids::new_run_id());
            let plan = WarmPlan {
                image: image.cloned(),
                run_dir: self.runs_dir.join(&member_id),
                member_id,
                shape: pool.shape,
                uid,
                gid: uid,
                max_timeout: self.max_timeout,
            };
            acted = true;
            *self.making.lock().unwrap_or_else(|e| e.into_inner()) = Some(plan.member_id.clone());
            let made = providers[pool.provider].warm(&plan);
            match made {
                Ok(member) => {
                    *pool.backoff.lock().unwrap_or_else(|e| e.into_inner()) = (0, None);
                    self.counts.made.fetch_add(1, Ordering::SeqCst);
                    pool.idle
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push_back(Idle {
                            member,
                            id: plan.member_id.clone(),
                            slot,
                            lease,
                            evidence_sha256: evidence.to_owned(),
                            image: image_identity.map(str::to_owned),
                            made: Instant::now(),
                        });
                }
                Err(e) => {
                    drop(lease);
                    self.free_slot(slot);
                    self.counts.failed.fetch_add(1, Ordering::SeqCst);
                    let mut b = pool.backoff.lock().unwrap_or_else(|e| e.into_inner());
                    b.0 = b.0.saturating_add(1);
                    let wait = backoff(b.0);
                    b.1 = Some(Instant::now() + wait);
                    tracing::warn!(
                        provider = pool.provider_name, language = ?pool.shape.language,
                        failures = b.0, retry_in_ms = wait.as_millis() as u64,
                        error = %e.message(), "cannot make a warm member"
                    );
                }
            }
            // Cleared once the member is idle (or gone), so it is always one or the other.
            *self.making.lock().unwrap_or_else(|e| e.into_inner()) = None;
        }
        acted
    }

    fn discard(&self, m: Idle) {
        let Idle {
            member,
            slot,
            lease,
            ..
        } = m;
        if let Err(e) = member.discard() {
            tracing::error!(error = %error_chain(e.as_ref()), "an unused warm member was not fully removed");
        }
        self.counts.discarded.fetch_add(1, Ordering::SeqCst);
        drop(lease);
        self.free_slot(slot);
    }

    /// Waits until nudged (a claim, a freed uid) or `at_most` passed.
    pub fn wait(&self, at_most: Duration) {
        let (lock, cv) = &self.wake;
        let g = lock.lock().unwrap_or_else(|e| e.into_inner());
        let seen = *g;
        let _ = cv
            .wait_timeout_while(g, at_most, |n| {
                *n == seen && !self.stop.load(Ordering::SeqCst)
            })
            .unwrap_or_else(|e| e.into_inner());
    }

    /// Tells the keeper to stop (it ends after the member it may be making).
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.nudge();
    }

    /// Stops the keeper and destroys every idle member; call once the keeper has ended.
    pub fn drain(&self) {
        self.stop();
        for pool in &self.pools {
            let gone: Vec<Idle> = pool
                .idle
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .drain(..)
                .collect();
            for m in gone {
                self.discard(m);
            }
        }
    }

    /// True once [`Pools::drain`] was called.
    pub fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }
}

/// Removals running off the answer's path (a used member's, a cold run's), each on a thread
/// of its own, counted so that shutdown and tests can wait for them.
#[derive(Debug, Default)]
pub(crate) struct Teardowns {
    running: Mutex<usize>,
    ended: Condvar,
}

impl Teardowns {
    /// Runs `teardown` on a thread named `name`, then `after` with how it ended (which frees
    /// what the removed sandbox held: its uid).
    pub fn spawn(
        self: &Arc<Self>,
        name: &str,
        teardown: Teardown,
        after: impl FnOnce(Result<(), plimsoll_sandbox::Cause>) + Send + 'static,
    ) {
        *self.running.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        let this = Arc::clone(self);
        let work = move || {
            after(teardown.run());
            *this.running.lock().unwrap_or_else(|e| e.into_inner()) -= 1;
            this.ended.notify_all();
        };
        // Without a thread, the removal runs here, on the caller's path, rather than never.
        let work = Arc::new(Mutex::new(Some(work)));
        let theirs = Arc::clone(&work);
        let spawned = std::thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || {
                let w = theirs.lock().unwrap_or_else(|e| e.into_inner()).take();
                if let Some(w) = w {
                    w();
                }
            });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "no thread for a teardown: it runs before the answer");
            let w = work.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(w) = w {
                w();
            }
        }
    }

    /// How many are running now.
    pub fn running(&self) -> usize {
        *self.running.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until every teardown has ended; false when some still ran after `within`.
    pub fn wait(&self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        let mut n = self.running.lock().unwrap_or_else(|e| e.into_inner());
        while *n > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            n = self
                .ended
                .wait_timeout(n, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn demand_grows_a_pool_up_to_max_members_and_shrinks_it_back_to_min_idle() {
        let pool = Pool {
            provider: 0,
            provider_name: "crun".into(),
            image: None,
            shape: WarmShape {
                language: Language::Python,
                memory_bytes: 1 << 30,
                pids: 64,
                disk_bytes: 1 << 26,
            },
            settings: PoolSettings {
                min_idle: 1,
                max_members: 3,
                max_age: Duration::from_secs(300),
                shrink_after: Duration::from_millis(50),
            },
            idle: Mutex::new(VecDeque::new()),
            backoff: Mutex::new((0, None)),
            demand: Mutex::new((1, Instant::now())),
        };
        // A claim that leaves members idle does not grow it; emptying claims do, never past
        // max_members.
        pool.claimed(false);
        assert_eq!(pool.wanted(), 1);
        for _ in 0..10 {
            pool.claimed(true);
        }
        assert_eq!(pool.wanted(), 3);
        // Without claims, one fewer per shrink_after, never below min_idle.
        for want in [2, 1, 1] {
            std::thread::sleep(Duration::from_millis(60));
            assert_eq!(pool.wanted(), want);
        }
    }

    #[test]
    fn backoff_doubles_from_100_ms_up_to_a_minute() {
        assert_eq!(backoff(0), Duration::from_millis(100));
        assert_eq!(backoff(1), Duration::from_millis(200));
        assert_eq!(backoff(3), Duration::from_millis(800));
        assert_eq!(backoff(10), Duration::from_secs(60));
        assert_eq!(backoff(u32::MAX), Duration::from_secs(60));
    }
}
