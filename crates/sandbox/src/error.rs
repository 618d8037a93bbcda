//! The provider boundary's errors, typed: a launch that did not start ([`LaunchError::NotStarted`])
//! or may have run ([`LaunchError::MayHaveRun`]), each keeping the error that caused it as its
//! source and a failed cleanup beside it; a kind of run a provider cannot do
//! ([`Unsupported`]); a provider whose probe failed ([`Withdrawn`]); cached evidence that no
//! longer describes a provider ([`Stale`]); a cancel that could not end a run's processes
//! ([`CancelRunError`]); a session's sandbox not fully removed ([`CloseSessionError`]).

use std::error::Error;
use std::fmt;

use plimsoll_wire::Reason;

/// The error behind a failure, kept whole (its own sources included).
pub type Cause = Box<dyn Error + Send + Sync + 'static>;

/// `e` and every source under it, joined by `: `.
pub fn error_chain(e: &dyn Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(inner) = cur {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        cur = inner.source();
    }
    s
}

/// Why a launch did not give a result.
#[derive(Debug)]
pub enum LaunchError {
    /// Failed before any code of the request started (setting up the sandbox). Nothing ran.
    NotStarted {
        /// The refusal reason (usually `environment`).
        reason: Reason,
        /// What failed, with its sources.
        error: Cause,
        /// Removing what the failed launch had set up failed too.
        cleanup: Option<Cause>,
    },
    /// Failed after the code may have started. Never safe to retry blindly.
    MayHaveRun {
        /// What failed, with its sources.
        error: Cause,
        /// Removing the sandbox afterwards failed too.
        cleanup: Option<Cause>,
    },
}

impl LaunchError {
    /// A setup failure before anything ran (`environment`).
    pub fn environment(error: impl Into<Cause>) -> Self {
        Self::not_started(Reason::Environment, error)
    }

    /// A failure before anything ran, for `reason`.
    pub fn not_started(reason: Reason, error: impl Into<Cause>) -> Self {
        LaunchError::NotStarted {
            reason,
            error: error.into(),
            cleanup: None,
        }
    }

    /// A failure after the code may have started.
    pub fn may_have_run(error: impl Into<Cause>) -> Self {
        LaunchError::MayHaveRun {
            error: error.into(),
            cleanup: None,
        }
    }

    /// The same failure, with the cleanup that failed after it kept beside it (the first
    /// cleanup failure wins; the failure itself stays what the caller is told first).
    pub fn with_cleanup(mut self, failed: impl Into<Cause>) -> Self {
        let (LaunchError::NotStarted { cleanup, .. } | LaunchError::MayHaveRun { cleanup, .. }) =
            &mut self;
        if cleanup.is_none() {
            *cleanup = Some(failed.into());
        }
        self
    }

    /// The same failure once its cleanup ran: unchanged when the cleanup worked, with the
    /// cleanup's failure kept beside it when not.
    pub fn after_cleanup<E: Into<Cause>>(self, cleanup: Result<(), E>) -> Self {
        match cleanup {
            Ok(()) => self,
            Err(c) => self.with_cleanup(c),
        }
    }

    /// The refusal reason when nothing ran; `None` when the code may have run.
    pub fn not_dispatched(&self) -> Option<Reason> {
        match self {
            LaunchError::NotStarted { reason, .. } => Some(*reason),
            LaunchError::MayHaveRun { .. } => None,
        }
    }

    /// The failure that ended the launch.
    pub fn error(&self) -> &(dyn Error + Send + Sync + 'static) {
        let (LaunchError::NotStarted { error, .. } | LaunchError::MayHaveRun { error, .. }) = self;
        error.as_ref()
    }

    /// The cleanup failure kept beside it, if any.
    pub fn cleanup(&self) -> Option<&(dyn Error + Send + Sync + 'static)> {
        let (LaunchError::NotStarted { cleanup, .. } | LaunchError::MayHaveRun { cleanup, .. }) =
            self;
        cleanup.as_deref()
    }

    /// The whole story for a person: the failure with its sources, then the cleanup's.
    pub fn message(&self) -> String {
        let mut s = error_chain(self.error());
        if let Some(c) = self.cleanup() {
            s.push_str("; and cleanup failed too: ");
            s.push_str(&error_chain(c));
        }
        s
    }
}

impl fmt::Display for LaunchError {
    /// The failure itself and the cleanup's; the failure's sources are reached through
    /// [`Error::source`] (or all at once through [`LaunchError::message`]).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self.error(), f)?;
        if let Some(c) = self.cleanup() {
            write!(f, "; and cleanup failed too: {}", error_chain(c))?;
        }
        Ok(())
    }
}

impl Error for LaunchError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.error().source()
    }
}

/// A kind of run a provider cannot do at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unsupported {
    /// The process tier runs snippets only.
    #[error("the process tier runs snippets only; projects need the container tier or above")]
    SnippetsOnly,
    /// The provider makes no warm members.
    #[error("this provider has no warm pool: its runs start cold")]
    NoWarmPool,
    /// The run asks for less memory than its interpreter needs at this provider
    /// ([`crate::Provider::memory_floor`]).
    #[error(
        "at this provider its interpreter needs memory_bytes of at least {needs} (the process tier bounds the address space by it): ask for at least that, or run it at the container tier or above"
    )]
    MemoryBelowFloor {
        /// The least memory the run needs here.
        needs: u64,
    },
    /// The provider keeps no session.
    #[error(
        "this provider keeps no session: sessions run at crun, runc, runsc and qemu; set a floor of container or above, or name one of them"
    )]
    NoSessions,
    /// The request named an image and this provider has none (the process tier).
    #[error(
        "the process tier has no image: it runs the host's interpreters; for image `{0}` set a floor of container or above, or name crun, runc, runsc or qemu"
    )]
    NoImage(String),
    /// The VM provider has no disk made from this image.
    #[error(
        "image `{0}` has no VM disk: rebuild it (`scripts/build-image {0}`) or import it again, which makes one; or run it at crun, runc or runsc"
    )]
    NoDisk(String),
    /// What the provider said across the launcher's socket (docs/privileges.md), as text.
    #[error("{0}")]
    Said(String),
}

/// Why a provider is not offered: the checks its probe failed, or why it could not probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Withdrawn {
    /// The probe ran and these checks failed, each `(name, why)`, in the checks map's order.
    Checks {
        /// The provider.
        provider: String,
        /// Each failed check and what it saw.
        failed: Vec<(String, String)>,
    },
    /// The probe could not run at all: why, and what to do.
    NotProbed(String),
}

impl fmt::Display for Withdrawn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Withdrawn::Checks { provider, failed } => {
                write!(f, "{provider} is not offered: ")?;
                for (i, (name, why)) in failed.iter().enumerate() {
                    if i > 0 {
                        f.write_str("; ")?;
                    }
                    write!(f, "{name}: {why}")?;
                }
                Ok(())
            }
            Withdrawn::NotProbed(why) => f.write_str(why),
        }
    }
}

impl Error for Withdrawn {}

/// A file that could not be read (its digest, its contents).
#[derive(Debug, thiserror::Error)]
#[error("cannot read {}: {io}", path.display())]
pub struct ReadFileError {
    /// The file.
    pub path: std::path::PathBuf,
    /// What reading it gave.
    pub io: std::io::Error,
}

/// Cached evidence that no longer describes a provider: it is probed again.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Stale {
    /// The sandbox image was rebuilt since the evidence was taken.
    #[error("the image is now {now}, the evidence was taken on {then}")]
    ImageChanged {
        /// The image's identity now.
        now: String,
        /// The identity the evidence names.
        then: String,
    },
    /// The image's identity cannot be read now.
    #[error("{0}")]
    ImageUnreadable(String),
    /// The evidence does not name what only a probe learns (the VM's accelerator).
    #[error("the evidence names no accelerator ({0:?})")]
    NoAccelerator(Option<String>),
    /// What the provider said across the launcher's socket (docs/privileges.md), as text.
    #[error("{0}")]
    Said(String),
}

/// Why [`crate::Provider::cancel`] could not end the processes of a cancelled run's sandbox.
#[derive(Debug, thiserror::Error)]
pub enum CancelRunError {
    /// The sandbox's processes could not be found (its cgroups, say).
    #[error("cannot find the processes of sandbox {sandbox}")]
    Find {
        /// The sandbox ([`crate::RunningIn::id`]).
        sandbox: String,
        /// What failed.
        #[source]
        cause: Cause,
    },
    /// Its processes were found but could not all be ended.
    #[error("cannot end the processes of sandbox {sandbox} (uid {uid})")]
    End {
        /// The sandbox ([`crate::RunningIn::id`]).
        sandbox: String,
        /// The uid its code runs as.
        uid: u32,
        /// What failed.
        #[source]
        cause: Cause,
    },
}

/// Why [`crate::SessionSandbox::close`] did not remove everything of a session's sandbox.
#[derive(Debug, thiserror::Error)]
pub enum CloseSessionError {
    /// Ending its processes or removing what it left failed.
    #[error("session sandbox {run_id} was not fully removed")]
    Remove {
        /// The run id its sandbox was opened under.
        run_id: String,
        /// What failed.
        #[source]
        cause: Cause,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("cannot write the bundle")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn a_launch_error_keeps_its_source_and_its_cleanup_beside_it() {
        let e = LaunchError::environment(Outer(std::io::Error::other("disk full")))
            .with_cleanup("cannot remove /run/x")
            .with_cleanup("a later cleanup failure is not the one kept");
        assert_eq!(e.not_dispatched(), Some(Reason::Environment));
        assert_eq!(
            e.to_string(),
            "cannot write the bundle; and cleanup failed too: cannot remove /run/x"
        );
        assert_eq!(
            e.message(),
            "cannot write the bundle: disk full; and cleanup failed too: cannot remove /run/x"
        );
        assert_eq!(
            e.source().map(|s| s.to_string()).as_deref(),
            Some("disk full")
        );
        assert!(
            e.error().downcast_ref::<Outer>().is_some(),
            "the typed cause is kept"
        );

        let m = LaunchError::may_have_run("the runtime died");
        assert_eq!(m.not_dispatched(), None);
        assert!(m.cleanup().is_none());
        assert_eq!(m.message(), "the runtime died");
    }

    #[test]
    fn a_cancel_or_close_error_names_its_sandbox_and_keeps_its_cause() {
        let e = CancelRunError::End {
            sandbox: "warm-ab12".into(),
            uid: 70_001,
            cause: Box::new(Outer(std::io::Error::other("EPERM"))),
        };
        assert_eq!(
            e.to_string(),
            "cannot end the processes of sandbox warm-ab12 (uid 70001)"
        );
        assert_eq!(
            error_chain(&e),
            "cannot end the processes of sandbox warm-ab12 (uid 70001): cannot write the bundle: EPERM"
        );
        let c = CloseSessionError::Remove {
            run_id: "r1".into(),
            cause: "cannot remove /run/x".into(),
        };
        assert_eq!(
            error_chain(&c),
            "session sandbox r1 was not fully removed: cannot remove /run/x"
        );
    }

    #[test]
    fn withdrawn_lists_every_failed_check() {
        let w = Withdrawn::Checks {
            provider: "crun".into(),
            failed: vec![
                ("network".into(), "eth0 is up".into()),
                ("uid".into(), "0".into()),
            ],
        };
        assert_eq!(
            w.to_string(),
            "crun is not offered: network: eth0 is up; uid: 0"
        );
    }
}
