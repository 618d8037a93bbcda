//! Admission: how many runs at once, globally and per caller, and which uid slot each holds.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use plimsoll_sandbox::{UidLease, try_lease};

use crate::error::BuildEngineError;

/// The run uid of slot `slot`: `base + slot`.
pub fn run_uid(base: u32, slot: usize) -> u32 {
    base + slot as u32
}

/// The controller uid of slot `slot` (a run's second uid, for a trial's controller):
/// `base + max_total + 1 + slot`, past the run uids and the probe uid (`base + max_total`).
pub fn controller_uid(base: u32, max_total: usize, slot: usize) -> u32 {
    base + max_total as u32 + 1 + slot as u32
}

/// The probe uid of the provider at `index` in the settings' list. The first keeps
/// `base + max_total`, between the run uids and the controller uids; each further one gets
/// its own past the controller uids, `base + 2 * max_total + index`, so every provider can
/// probe at the same moment as the others (a probe ends every process of its uid).
pub fn probe_uid(base: u32, max_total: usize, index: usize) -> u32 {
    if index == 0 {
        base + max_total as u32
    } else {
        base + 2 * max_total as u32 + index as u32
    }
}

/// One past the last uid an engine with `max_total` run slots and `providers` providers
/// uses from `base`: run uids, the first probe uid, controller uids, then one probe uid per
/// further provider (`None` past `u32`).
pub fn uid_range_end(base: u32, max_total: usize, providers: usize) -> Option<u32> {
    u32::try_from(max_total)
        .ok()?
        .checked_mul(2)?
        .checked_add(u32::try_from(providers.max(1)).ok()?)?
        .checked_add(base)
}

/// How long a run under the limits waits for a uid slot that is only held by an answered
/// run's removal, or by a lease a moment from its release, before it is refused.
pub const SLOT_WAIT: Duration = Duration::from_secs(10);

/// Counts runs in flight. Over a limit, a run is refused at once (`capacity`), never queued.
/// Under the limits, a run whose uid slots are all held by answered runs' removals (or by
/// leases being released) waits for one, up to a bound, since it is not over any limit.
#[derive(Debug)]
pub struct Admission {
    max_total: usize,
    max_per_caller: usize,
    /// With `Some((dir, base))`, slot `i` also needs the host-wide leases on its two uids,
    /// [`run_uid`] and [`controller_uid`].
    uid_leases: Option<(PathBuf, u32)>,
    /// How long a run under the limits waits for a uid slot ([`SLOT_WAIT`]).
    slot_wait: Duration,
    state: Mutex<State>,
    /// Told when a slot is given back.
    freed: Condvar,
}

#[derive(Debug, Default)]
struct State {
    /// `slots[i]` is true while a run holds uid slot `i`.
    slots: Vec<bool>,
    per_caller: HashMap<String, usize>,
}

/// A run's place: its caller's count and its uid slot, released when dropped.
#[derive(Debug)]
pub struct Permit {
    admission: Arc<Admission>,
    /// `None` once the run was answered ([`Permit::answered`]).
    caller: Option<String>,
    slot: usize,
    _leases: Vec<UidLease>,
}

impl Permit {
    /// The uid slot this run holds, `0..max_total`.
    pub fn slot(&self) -> usize {
        self.slot
    }

    /// The run is answered: its caller's place is given back now (the caller may send its
    /// next run), while its uid slot stays held until the returned permit is dropped, once
    /// what is left of its sandbox has been removed off the answer's path.
    pub fn answered(mut self) -> Permit {
        if let Some(caller) = self.caller.take() {
            let mut st = self
                .admission
                .state
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            st.release_caller(&caller);
        }
        self
    }
}

impl State {
    fn release_caller(&mut self, caller: &str) {
        if let Some(n) = self.per_caller.get_mut(caller) {
            *n -= 1;
            if *n == 0 {
                self.per_caller.remove(caller);
            }
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        // The leases go first: a slot seen free has its uids free too.
        drop(std::mem::take(&mut self._leases));
        let mut st = self
            .admission
            .state
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        st.slots[self.slot] = false;
        if let Some(caller) = self.caller.take() {
            st.release_caller(&caller);
        }
        drop(st);
        self.admission.freed.notify_all();
    }
}

impl Admission {
    /// Limits: runs at once in total, and per caller.
    pub fn new(max_total: usize, max_per_caller: usize) -> Arc<Self> {
        Self::build(max_total, max_per_caller, None)
    }

    /// Limits as [`Admission::new`], and slot `i` is only handed out while this process holds
    /// the host-wide leases on its run uid and its controller uid (leases in `lease_dir`), so
    /// no other engine on the host runs code as either at the same time.
    pub fn with_uid_leases(
        max_total: usize,
        max_per_caller: usize,
        lease_dir: PathBuf,
        uid_base: u32,
    ) -> Arc<Self> {
        Self::build(max_total, max_per_caller, Some((lease_dir, uid_base)))
    }

    fn build(
        max_total: usize,
        max_per_caller: usize,
        uid_leases: Option<(PathBuf, u32)>,
    ) -> Arc<Self> {
        Arc::new(Admission {
            max_total,
            max_per_caller,
            uid_leases,
            slot_wait: SLOT_WAIT,
            state: Mutex::new(State {
                slots: vec![false; max_total],
                per_caller: HashMap::new(),
            }),
            freed: Condvar::new(),
        })
    }

    /// The same admission waiting at most `wait` for a uid slot (for tests).
    #[cfg(test)]
    fn waiting_at_most(self: Arc<Self>, wait: Duration) -> Arc<Self> {
        let mut a = Arc::into_inner(self).expect("not shared yet");
        a.slot_wait = wait;
        Arc::new(a)
    }

    /// Takes a place for `caller`, or says which limit is full. Over a limit it refuses at
    /// once; under them it waits (up to [`SLOT_WAIT`]) for a uid slot held by an answered
    /// run's removal or by a lease about to be released.
    pub fn try_admit(self: &Arc<Self>, caller: &str) -> Result<Permit, String> {
        let deadline = Instant::now() + self.slot_wait;
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            let mine = st.per_caller.get(caller).copied().unwrap_or(0);
            if mine >= self.max_per_caller {
                return Err(format!(
                    "caller `{caller}` already has {mine} runs in flight (limit {}): retry when one ends",
                    self.max_per_caller
                ));
            }
            let unanswered: usize = st.per_caller.values().sum();
            if unanswered >= self.max_total {
                return Err(self.full(0));
            }
            let (taken, held_elsewhere) = self.take_slot(&st)?;
            if let Some((slot, leases)) = taken {
                st.slots[slot] = true;
                *st.per_caller.entry(caller.to_owned()).or_insert(0) += 1;
                return Ok(Permit {
                    admission: Arc::clone(self),
                    caller: Some(caller.to_owned()),
                    slot,
                    _leases: leases,
                });
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(if held_elsewhere > 0 {
                    self.full(held_elsewhere)
                } else {
                    format!(
                        "the server's {} sandbox uid slots are all held, by open sessions (each holds one for its life) or by runs whose sandboxes are still being removed: close a session, or retry shortly",
                        self.max_total
                    )
                });
            }
            // A lease held elsewhere frees without telling us: look again soon.
            let wait = (deadline - now).min(Duration::from_millis(10));
            st = self
                .freed
                .wait_timeout(st, wait)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// The first free slot whose uids this process could lease, with its leases, and how
    /// many free slots had a uid held elsewhere.
    #[expect(clippy::type_complexity, reason = "a private pair read at one place")]
    fn take_slot(&self, st: &State) -> Result<(Option<(usize, Vec<UidLease>)>, usize), String> {
        let mut held_elsewhere = 0;
        for slot in (0..st.slots.len()).filter(|i| !st.slots[*i]) {
            let Some((dir, base)) = &self.uid_leases else {
                return Ok((Some((slot, Vec::new())), 0));
            };
            let uids = [
                run_uid(*base, slot),
                controller_uid(*base, self.max_total, slot),
            ];
            let mut leases = Vec::with_capacity(2);
            for uid in uids {
                match try_lease(dir, uid) {
                    Ok(Some(lease)) => leases.push(lease),
                    Ok(None) => break,
                    Err(e) => {
                        return Err(format!(
                            "cannot lease sandbox uid {uid} in {}: {e}",
                            dir.display()
                        ));
                    }
                }
            }
            if leases.len() == uids.len() {
                return Ok((Some((slot, leases)), held_elsewhere));
            }
            held_elsewhere += 1;
        }
        Ok((None, held_elsewhere))
    }

    /// The refusal of a full server.
    fn full(&self, held_elsewhere: usize) -> String {
        let also = if held_elsewhere > 0 {
            format!(
                " ({held_elsewhere} of its sandbox uids are held by another plimsoll engine on this host: give each engine its own sandbox_uid_base)"
            )
        } else {
            String::new()
        };
        format!(
            "the server is running its limit of {} runs at once{also}: retry shortly",
            self.max_total
        )
    }

    /// Runs in flight now: admitted and not yet answered.
    pub fn in_flight(&self) -> usize {
        let st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        st.per_caller.values().sum()
    }
}

/// Sandbox uids must sit above the 16-bit range where system and login accounts live, and the
/// whole range (run uids, the first probe uid, the controller uids, then one probe uid per
/// further provider) must fit in a uid.
pub(crate) fn validate_uid_range(
    base: u32,
    max_concurrent: usize,
    providers: usize,
) -> Result<(), BuildEngineError> {
    const LOWEST: u32 = 65_536;
    let top = uid_range_end(base, max_concurrent, providers).map(|end| end - 1);
    match top {
        Some(top) if base >= LOWEST && top < u32::MAX - 1 => Ok(()),
        _ => Err(BuildEngineError::Invalid(format!(
            "sandbox_uid_base = {base} with max_concurrent = {max_concurrent} and {providers} provider(s) is out of range: the uids base..=base+2*max_concurrent+providers-1 must lie between {LOWEST} and {}, unused on this host",
            u32::MAX - 2
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_run_controller_and_probe_uid_is_distinct_and_in_range() {
        for (max, providers) in [(1, 1), (1, 5), (8, 1), (8, 5), (3, 2)] {
            let base = 100_000;
            let mut uids: Vec<u32> = (0..max)
                .flat_map(|slot| [run_uid(base, slot), controller_uid(base, max, slot)])
                .chain((0..providers).map(|i| probe_uid(base, max, i)))
                .collect();
            let n = uids.len();
            uids.sort_unstable();
            uids.dedup();
            assert_eq!(
                uids.len(),
                n,
                "max {max}, providers {providers}: a uid is shared"
            );
            // The range the settings check: base..=base+2*max+providers-1, with no gap.
            assert_eq!(uids[0], base);
            assert_eq!(
                *uids.last().unwrap(),
                base + 2 * max as u32 + providers as u32 - 1
            );
            assert_eq!(
                uid_range_end(base, max, providers),
                Some(*uids.last().unwrap() + 1)
            );
            assert!(validate_uid_range(base, max, providers).is_ok());
        }
        assert!(validate_uid_range(u32::MAX - 30, 8, 20).is_err());
    }

    #[test]
    fn limits_hold_and_release() {
        let a = Admission::new(2, 1);
        let p1 = a.try_admit("alice").unwrap();
        assert!(a.try_admit("alice").unwrap_err().contains("alice"));
        let p2 = a.try_admit("bob").unwrap();
        assert_ne!(p1.slot(), p2.slot());
        assert!(a.try_admit("carol").unwrap_err().contains("limit of 2"));
        drop(p1);
        let p3 = a.try_admit("carol").unwrap();
        assert_eq!(a.in_flight(), 2);
        drop((p2, p3));
        assert_eq!(a.in_flight(), 0);
    }

    /// An answered run gives its caller's place back at once, and its uid slot only when
    /// its sandbox's removal has ended (the permit dropped); a run under the limits waits
    /// for that slot rather than being refused, up to the bound.
    #[test]
    fn an_answered_run_keeps_its_uid_until_its_removal_ends() {
        let a = Admission::new(2, 1);
        let p1 = a.try_admit("alice").unwrap();
        let slot = p1.slot();
        let tearing = p1.answered();
        assert_eq!(a.in_flight(), 0);
        let p2 = a
            .try_admit("alice")
            .expect("alice's first run was answered");
        assert_ne!(p2.slot(), slot, "a slot being torn down was handed out");
        let removal = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            drop(tearing);
        });
        let started = Instant::now();
        let p3 = a.try_admit("bob").expect("bob is under every limit");
        assert!(
            started.elapsed() >= Duration::from_millis(90),
            "bob got a held slot"
        );
        assert_eq!(p3.slot(), slot);
        assert_eq!(a.in_flight(), 2);
        removal.join().unwrap();
        // Over the limit: refused at once, no wait.
        let started = Instant::now();
        assert!(a.try_admit("carol").unwrap_err().contains("limit of 2"));
        assert!(started.elapsed() < Duration::from_secs(1));
    }

    /// A slot held only by a removal that does not end is refused after the bound, saying so.
    #[test]
    fn a_run_waits_for_a_removal_only_up_to_the_bound() {
        let a = Admission::new(1, 1).waiting_at_most(Duration::from_millis(100));
        let tearing = a.try_admit("alice").unwrap().answered();
        let refused = a.try_admit("bob").unwrap_err();
        assert!(refused.contains("still being removed"), "{refused}");
        drop(tearing);
        assert!(a.try_admit("bob").is_ok());
    }

    #[test]
    fn two_engines_never_share_a_uid() {
        let dir = std::env::temp_dir().join(format!("plimsoll-admission-{}", std::process::id()));
        let wait = Duration::from_millis(100);
        let one = Admission::with_uid_leases(2, 2, dir.clone(), 5000).waiting_at_most(wait);
        let two = Admission::with_uid_leases(2, 2, dir.clone(), 5000).waiting_at_most(wait);
        let a = one.try_admit("x").unwrap();
        let b = two.try_admit("x").unwrap();
        assert_ne!(
            a.slot(),
            b.slot(),
            "both engines took uid {}",
            5000 + a.slot()
        );
        let refused = one.try_admit("y").unwrap_err();
        assert!(refused.contains("another plimsoll engine"), "{refused}");
        drop(b);
        assert!(one.try_admit("y").is_ok());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A lease held for a moment elsewhere (a child forked while a run held it keeps it
    /// until it closes its descriptors) delays the next run; it is not refused.
    #[test]
    fn a_lease_held_for_a_moment_is_waited_for() {
        let dir = std::env::temp_dir().join(format!("plimsoll-moment-{}", std::process::id()));
        let held = try_lease(&dir, run_uid(6000, 0)).unwrap().unwrap();
        let one = Admission::with_uid_leases(1, 1, dir.clone(), 6000);
        let release = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            drop(held);
        });
        let p = one
            .try_admit("x")
            .expect("the lease was released within the bound");
        assert_eq!(p.slot(), 0);
        release.join().unwrap();
        drop(p);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_slot_needs_its_controller_uid_too() {
        let dir = std::env::temp_dir().join(format!("plimsoll-ctl-{}", std::process::id()));
        assert_eq!((run_uid(5000, 1), controller_uid(5000, 2, 1)), (5001, 5004));
        // Another engine holds slot 0's controller uid (5003) only: slot 0 is skipped.
        let held = try_lease(&dir, controller_uid(5000, 2, 0))
            .unwrap()
            .unwrap();
        let one = Admission::with_uid_leases(2, 2, dir.clone(), 5000)
            .waiting_at_most(Duration::from_millis(100));
        let a = one.try_admit("x").unwrap();
        assert_eq!(a.slot(), 1);
        // Its run uid was given back: a lease of 5000 now succeeds.
        assert!(try_lease(&dir, run_uid(5000, 0)).unwrap().is_some());
        let refused = one.try_admit("x").unwrap_err();
        assert!(refused.contains("another plimsoll engine"), "{refused}");
        drop(held);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
