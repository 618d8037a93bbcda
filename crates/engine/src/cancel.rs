//! What a caller can hook into a run besides its request: where its output goes as it is
//! read (a streamed answer), and a way to end it early (the client that asked went away).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use plimsoll_sandbox::OutputTap;

/// Hooks into one run; [`Default`] is none (as [`crate::Engine::run`] runs).
#[derive(Debug, Clone, Default)]
pub struct RunHooks {
    /// Where the run's output also goes as it is read, at the providers that read a
    /// snippet's output themselves as it comes (process, crun, runc, runsc).
    pub tap: Option<OutputTap>,
    /// Ends the run early when cancelled: the engine arms it with the provider's `cancel` of
    /// the sandbox the run runs in (its own, or the warm member's that took it), and a run
    /// cancelled before its answer ends `RunError::Cancelled`, however its sandbox ended.
    pub cancel: Option<Arc<Cancel>>,
}

type Killer = Box<dyn Fn() + Send + Sync>;

/// A run's cancellation: once cancelled, a run not yet dispatched is refused, and one that
/// is dispatched has its sandbox's processes killed (by the provider's own means) each time
/// [`Cancel::cancel`] is called, so a caller that calls it again while the run is still going
/// also ends one whose processes were not there yet at the first call.
#[derive(Default)]
pub struct Cancel {
    cancelled: AtomicBool,
    killer: Mutex<Option<Killer>>,
}

impl std::fmt::Debug for Cancel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cancel")
            .field("cancelled", &self.is_cancelled())
            .finish_non_exhaustive()
    }
}

impl Cancel {
    /// A cancellation not yet cancelled.
    pub fn new() -> Arc<Self> {
        Arc::new(Cancel::default())
    }

    /// Cancels: kills the run's processes if it is dispatched (again, if called again).
    pub fn cancel(&self) {
        self.cancelled.store(true, Ordering::SeqCst);
        let killer = self.killer.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(kill) = killer.as_ref() {
            kill();
        }
    }

    /// Whether it was cancelled.
    pub fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::SeqCst)
    }

    /// What [`Cancel::cancel`] kills from now on (the run about to be dispatched; through
    /// `Engine::arm_cancel`, the sandbox it runs in: a cold run's, a warm member's, or a
    /// session's for a call in it).
    pub(crate) fn arm(&self, kill: Killer) {
        *self.killer.lock().unwrap_or_else(|p| p.into_inner()) = Some(kill);
    }

    /// Nothing to kill any more (the run is over).
    pub(crate) fn disarm(&self) {
        *self.killer.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn a_cancel_kills_what_is_armed_each_time_and_nothing_once_disarmed() {
        let c = Cancel::new();
        c.cancel();
        assert!(c.is_cancelled());
        let kills = Arc::new(AtomicUsize::new(0));
        let k = Arc::clone(&kills);
        c.arm(Box::new(move || {
            k.fetch_add(1, Ordering::SeqCst);
        }));
        c.cancel();
        c.cancel();
        assert_eq!(kills.load(Ordering::SeqCst), 2);
        c.disarm();
        c.cancel();
        assert_eq!(kills.load(Ordering::SeqCst), 2);
    }
}
