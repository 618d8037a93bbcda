//! Where one cold run's time goes: an `Instant` mark at the end of each phase, logged as
//! one `debug` event per run (`run phases`, target `plimsoll_oci::phases`) with each
//! phase's milliseconds. Nothing of it reaches the result, the record or the wire.

use std::time::{Duration, Instant};

/// The phases of one cold run, in order (docs/container-tier.md, "Where a cold start's
/// time goes").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Checks, the image's root file system, the run directory and its lock.
    Prepare,
    /// `bundle/config.json`, the tools directory and its files (and a broker socket).
    Bundle,
    /// `<runtime> create` (a snippet's: `<runtime> run --detach`) until it exited and the
    /// container's process was opened.
    Create,
    /// The watchdog outside the daemon started (a `/bin/sh` fork and exec).
    Watchdog,
    /// A snippet's: its interpreter starting until it waits for its code (at runsc, after
    /// saying its wall).
    Ready,
    /// A snippet's: its wall read and judged, its code written, its watchdog given the
    /// deadline, `go` sent.
    Claim,
    /// `<runtime> start` until it exited (the code may already be running).
    Start,
    /// From `start`'s exit (a snippet's: from `go`) until the container's process was seen
    /// to exit.
    Exit,
    /// The pipes drained to their end, the process and helpers reaped.
    Drain,
    /// The daemon-side deadline thread joined, the memory cgroup read.
    Memory,
    /// The watchdog outside the daemon ended and reaped.
    WatchdogEnd,
    /// `<runtime> delete --force`, if the runtime left state.
    Delete,
    /// The run's cgroups removed in every hierarchy.
    Cgroup,
    /// The run directory removed, its lock released.
    Dir,
}

const PHASES: usize = 14;

impl Phase {
    fn index(self) -> usize {
        self as usize
    }
}

/// The marks of one run.
#[derive(Debug, Clone)]
pub(crate) struct Phases {
    began: Instant,
    last: Instant,
    /// When the run's outcome was ready to answer, if its removal came after.
    answered: Option<Instant>,
    spent: [Duration; PHASES],
}

impl Default for Phases {
    fn default() -> Self {
        Phases::new()
    }
}

impl Phases {
    /// Starts timing now.
    pub(crate) fn new() -> Self {
        let now = Instant::now();
        Phases {
            began: now,
            last: now,
            answered: None,
            spent: [Duration::ZERO; PHASES],
        }
    }

    /// `phase` ended now: the time since the previous mark is its.
    pub(crate) fn mark(&mut self, phase: Phase) {
        self.mark_at(phase, Instant::now());
    }

    /// `phase` ended at `at` (not before the previous mark).
    pub(crate) fn mark_at(&mut self, phase: Phase, at: Instant) {
        let at = at.max(self.last);
        self.spent[phase.index()] += at - self.last;
        self.last = at;
    }

    /// The outcome is ready to answer now; what is marked after is the removal.
    pub(crate) fn answered(&mut self) {
        self.answered = Some(Instant::now().max(self.last));
    }

    fn ms(&self, phase: Phase) -> f64 {
        self.spent[phase.index()].as_secs_f64() * 1000.0
    }

    /// The one event of the run.
    pub(crate) fn log(&self, provider: &str, run_id: &str, kind: &str) {
        let total = (self.last - self.began).as_secs_f64() * 1000.0;
        let answer = (self.answered.unwrap_or(self.last) - self.began).as_secs_f64() * 1000.0;
        tracing::debug!(
            target: "plimsoll_oci::phases",
            provider,
            run_id,
            kind,
            prepare_ms = self.ms(Phase::Prepare),
            bundle_ms = self.ms(Phase::Bundle),
            create_ms = self.ms(Phase::Create),
            watchdog_ms = self.ms(Phase::Watchdog),
            ready_ms = self.ms(Phase::Ready),
            claim_ms = self.ms(Phase::Claim),
            start_ms = self.ms(Phase::Start),
            exit_ms = self.ms(Phase::Exit),
            drain_ms = self.ms(Phase::Drain),
            memory_ms = self.ms(Phase::Memory),
            watchdog_end_ms = self.ms(Phase::WatchdogEnd),
            delete_ms = self.ms(Phase::Delete),
            cgroup_ms = self.ms(Phase::Cgroup),
            dir_ms = self.ms(Phase::Dir),
            answer_ms = answer,
            total_ms = total,
            "run phases"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_mark_takes_the_time_since_the_previous_one() {
        let mut p = Phases::new();
        let t0 = p.began;
        p.mark_at(Phase::Prepare, t0 + Duration::from_millis(2));
        p.mark_at(Phase::Create, t0 + Duration::from_millis(7));
        // A mark before the previous one counts nothing and moves nothing back.
        p.mark_at(Phase::Start, t0 + Duration::from_millis(5));
        p.mark_at(Phase::Create, t0 + Duration::from_millis(8));
        assert_eq!(p.ms(Phase::Prepare), 2.0);
        assert_eq!(p.ms(Phase::Create), 6.0);
        assert_eq!(p.ms(Phase::Start), 0.0);
        assert_eq!(p.last - p.began, Duration::from_millis(8));
    }
}
