//! A provider probed again after it was set in doubt: why ([`Recheck`]), and each provider's
//! flags ([`RecheckState`]): being probed again, its environment seen to have moved.

use std::sync::atomic::{AtomicBool, Ordering};

/// The unavailability a provider shows while its environment is known to have moved since
/// its probe and it is probed again.
pub(crate) const STALE: &str =
    "its environment changed since its probe and it is being probed again; retry shortly";

/// Why a provider is probed again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Recheck {
    /// A failure that concerns it: it serves on its last good evidence until the probe
    /// says otherwise.
    AfterFailure,
    /// Its environment moved since its evidence: skipped until the probe has ended.
    Stale,
}

/// One provider's re-check flags.
#[derive(Debug, Default)]
pub(crate) struct RecheckState {
    /// Set while a probe after a failure is running in the background (at most one at a
    /// time). The provider keeps serving on its last good evidence meanwhile: what one
    /// request did never takes it away from everyone; only the probe's own failure does.
    rechecking: AtomicBool,
    /// Set when its environment was seen to have moved since its evidence (a rebuilt
    /// image): routing skips it until the probe this started has ended.
    stale: AtomicBool,
}

impl RecheckState {
    /// True while it is being probed again in the background.
    pub(crate) fn rechecking(&self) -> bool {
        self.rechecking.load(Ordering::SeqCst)
    }

    /// True while its environment is known to have moved and its probe has not ended.
    pub(crate) fn stale(&self) -> bool {
        self.stale.load(Ordering::SeqCst)
    }

    /// Marks it to be probed again for `why`: true when the caller is to start that probe,
    /// false when one is already running.
    pub(crate) fn begin(&self, why: Recheck) -> bool {
        if why == Recheck::Stale {
            self.stale.store(true, Ordering::SeqCst);
        }
        !self.rechecking.swap(true, Ordering::SeqCst)
    }

    /// Its probe has ended: neither flag holds any more.
    pub(crate) fn ended(&self) {
        self.stale.store(false, Ordering::SeqCst);
        self.rechecking.store(false, Ordering::SeqCst);
    }
}
