//! Counters behind `GET /metrics`, written in the Prometheus text exposition format by hand.
//! Labels are bounded sets (provider names, outcomes, reasons, known routes, status codes);
//! nothing secret, and no caller-chosen text, ever becomes a label.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;

use plimsoll_engine::Engine;
use plimsoll_wire::{Reason, RunResult};

/// How a run that happened ended, as a metrics label.
pub fn outcome_label(result: &RunResult) -> &'static str {
    if result.timed_out {
        "timed_out"
    } else if result.oom_killed {
        "oom_killed"
    } else if result.exit_code == Some(0) {
        "ok"
    } else {
        "error"
    }
}

/// The outcome label of a run that failed after it may have started.
pub const OUTCOME_SANDBOX_FAILED: &str = "sandbox_failed";

/// The outcome label of a run cancelled after dispatch (its client went away), however its
/// sandbox ended.
pub const OUTCOME_CANCELLED: &str = "cancelled";

#[derive(Debug, Default)]
struct Inner {
    runs: BTreeMap<(String, &'static str), u64>,
    refusals: BTreeMap<&'static str, u64>,
    duration: BTreeMap<String, (u64, u64)>,
    http: BTreeMap<(&'static str, u16), u64>,
}

/// The daemon's counters.
#[derive(Debug)]
pub struct Metrics {
    inner: Mutex<Inner>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut inner = Inner::default();
        for r in Reason::ALL {
            inner.refusals.insert(r.as_str(), 0);
        }
        Metrics {
            inner: Mutex::new(inner),
        }
    }
}

impl Metrics {
    fn with<R>(&self, f: impl FnOnce(&mut Inner) -> R) -> R {
        f(&mut self.inner.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// A run happened on `provider` and gave a result.
    pub fn run_completed(&self, provider: &str, outcome: &'static str, duration_ms: u64) {
        self.with(|m| {
            *m.runs.entry((provider.to_owned(), outcome)).or_default() += 1;
            let d = m.duration.entry(provider.to_owned()).or_default();
            d.0 += duration_ms;
            d.1 += 1;
        });
    }

    /// A run was dispatched to `provider` and failed after it may have started.
    pub fn run_failed(&self, provider: &str) {
        self.with(|m| {
            *m.runs
                .entry((provider.to_owned(), OUTCOME_SANDBOX_FAILED))
                .or_default() += 1;
        });
    }

    /// A run was dispatched to `provider` and cancelled: its client went away.
    pub fn run_cancelled(&self, provider: &str) {
        self.with(|m| {
            *m.runs
                .entry((provider.to_owned(), OUTCOME_CANCELLED))
                .or_default() += 1;
        });
    }

    /// A run request was refused before anything ran.
    pub fn refused(&self, reason: Reason) {
        self.with(|m| *m.refusals.entry(reason.as_str()).or_default() += 1);
    }

    /// An HTTP answer was sent.
    pub fn http(&self, route: &'static str, status: u16) {
        self.with(|m| *m.http.entry((route, status)).or_default() += 1);
    }

    /// The exposition text, with the engine's live gauges.
    pub fn render(&self, engine: &Engine, streams_delivering: usize) -> String {
        let mut out = String::new();
        let providers = engine.providers();
        self.with(|m| {
            out.push_str("# HELP plimsoll_runs_total Runs that were dispatched, by provider and outcome (ok, error, timed_out, oom_killed, sandbox_failed, cancelled).\n");
            out.push_str("# TYPE plimsoll_runs_total counter\n");
            for ((provider, outcome), n) in &m.runs {
                let _ = writeln!(
                    out,
                    "plimsoll_runs_total{{provider=\"{}\",outcome=\"{outcome}\"}} {n}",
                    escape(provider)
                );
            }
            out.push_str("# HELP plimsoll_refusals_total Run requests refused before anything ran, by not-dispatched reason.\n");
            out.push_str("# TYPE plimsoll_refusals_total counter\n");
            for (reason, n) in &m.refusals {
                let _ = writeln!(out, "plimsoll_refusals_total{{reason=\"{reason}\"}} {n}");
            }
            out.push_str("# HELP plimsoll_run_duration_seconds Wall time of runs that gave a result, by provider.\n");
            out.push_str("# TYPE plimsoll_run_duration_seconds summary\n");
            for (provider, (sum_ms, count)) in &m.duration {
                let p = escape(provider);
                let _ = writeln!(
                    out,
                    "plimsoll_run_duration_seconds_sum{{provider=\"{p}\"}} {}",
                    *sum_ms as f64 / 1000.0
                );
                let _ = writeln!(
                    out,
                    "plimsoll_run_duration_seconds_count{{provider=\"{p}\"}} {count}"
                );
            }
            out.push_str(
                "# HELP plimsoll_http_requests_total HTTP answers, by route and status code.\n",
            );
            out.push_str("# TYPE plimsoll_http_requests_total counter\n");
            for ((route, status), n) in &m.http {
                let _ = writeln!(
                    out,
                    "plimsoll_http_requests_total{{route=\"{route}\",status=\"{status}\"}} {n}"
                );
            }
        });
        out.push_str("# HELP plimsoll_runs_in_flight Runs admitted and not yet answered.\n");
        out.push_str("# TYPE plimsoll_runs_in_flight gauge\n");
        let _ = writeln!(out, "plimsoll_runs_in_flight {}", engine.in_flight());
        out.push_str("# HELP plimsoll_teardowns_running Sandboxes being removed after their run was answered.\n");
        out.push_str("# TYPE plimsoll_teardowns_running gauge\n");
        let _ = writeln!(
            out,
            "plimsoll_teardowns_running {}",
            engine.teardowns_running()
        );
        out.push_str("# HELP plimsoll_streams_delivering Streamed answers whose client has not yet taken their last line (each holds a place of its caller's).\n");
        out.push_str("# TYPE plimsoll_streams_delivering gauge\n");
        let _ = writeln!(out, "plimsoll_streams_delivering {streams_delivering}");
        out.push_str("# HELP plimsoll_sessions_open Sessions open now.\n");
        out.push_str("# TYPE plimsoll_sessions_open gauge\n");
        let _ = writeln!(out, "plimsoll_sessions_open {}", engine.sessions_open());
        out.push_str("# HELP plimsoll_session_ends_total Ends of sessions and of their interpreters, by reason (docs/sessions.md).\n");
        out.push_str("# TYPE plimsoll_session_ends_total counter\n");
        for (reason, n) in engine.session_ends() {
            let _ = writeln!(
                out,
                "plimsoll_session_ends_total{{reason=\"{reason}\"}} {n}"
            );
        }
        out.push_str(
            "# HELP plimsoll_provider_available 1 when the provider's last probe passed, else 0.\n",
        );
        out.push_str("# TYPE plimsoll_provider_available gauge\n");
        for p in &providers {
            let _ = writeln!(
                out,
                "plimsoll_provider_available{{provider=\"{}\",isolation=\"{}\"}} {}",
                escape(&p.name),
                p.isolation,
                u8::from(p.available)
            );
        }
        out.push_str(
            "# HELP plimsoll_pool_idle Warm members idle and waiting, by provider and language.\n",
        );
        out.push_str("# TYPE plimsoll_pool_idle gauge\n");
        // Pools of one provider and language for several images count together.
        let idle = by_provider_and_language(engine.pools_idle());
        for (provider, language, n) in &idle {
            let _ = writeln!(
                out,
                "plimsoll_pool_idle{{provider=\"{}\",language=\"{}\"}} {n}",
                escape(provider),
                language.as_str()
            );
        }
        out.push_str("# HELP plimsoll_pool_wanted Warm members each pool keeps idle now (min_idle, grown by demand up to max_members), by provider and language; fewer idle than this means a refill is due or under way.\n");
        out.push_str("# TYPE plimsoll_pool_wanted gauge\n");
        for (provider, language, n) in by_provider_and_language(engine.pools_wanted()) {
            let _ = writeln!(
                out,
                "plimsoll_pool_wanted{{provider=\"{}\",language=\"{}\"}} {n}",
                escape(&provider),
                language.as_str()
            );
        }
        if !idle.is_empty() {
            out.push_str(
                "# HELP plimsoll_pool_making 1 while a warm member is being made, else 0.\n",
            );
            out.push_str("# TYPE plimsoll_pool_making gauge\n");
            let _ = writeln!(
                out,
                "plimsoll_pool_making {}",
                u8::from(engine.pool_making())
            );
        }
        out.push_str("# HELP plimsoll_pool_members_total Warm members since start, by event: made (ready and waiting), claimed (by a run), empty (a run matched a pool with none and ran cold), discarded (destroyed unused: too old, stale evidence, drained), failed (could not be made).\n");
        out.push_str("# TYPE plimsoll_pool_members_total counter\n");
        let c = engine.pool_counts();
        for (event, n) in [
            ("made", &c.made),
            ("claimed", &c.claimed),
            ("empty", &c.empty),
            ("discarded", &c.discarded),
            ("failed", &c.failed),
        ] {
            let _ = writeln!(
                out,
                "plimsoll_pool_members_total{{event=\"{event}\"}} {}",
                n.load(std::sync::atomic::Ordering::SeqCst)
            );
        }
        out.push_str("# HELP plimsoll_ready 1 when the daemon is ready to run requests.\n");
        out.push_str("# TYPE plimsoll_ready gauge\n");
        let _ = writeln!(out, "plimsoll_ready {}", u8::from(engine.ready()));
        out
    }
}

/// Escapes a label value: backslash, double quote and newline.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// `(provider, language, n)` per pool, summed over pools of one provider and language (for
/// several images), in first-seen order.
fn by_provider_and_language(
    per_pool: Vec<(String, plimsoll_wire::Language, usize)>,
) -> Vec<(String, plimsoll_wire::Language, usize)> {
    let mut out: Vec<(String, plimsoll_wire::Language, usize)> = Vec::new();
    for (provider, language, n) in per_pool {
        match out
            .iter_mut()
            .find(|(p, l, _)| *p == provider && *l == language)
        {
            Some(seen) => seen.2 += n,
            None => out.push((provider, language, n)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_and_escapes() {
        let mut r = RunResult {
            exit_code: Some(0),
            start: None,
            member_age_ms: None,
            ..RunResult::default()
        };
        assert_eq!(outcome_label(&r), "ok");
        r.exit_code = Some(3);
        assert_eq!(outcome_label(&r), "error");
        r.timed_out = true;
        assert_eq!(outcome_label(&r), "timed_out");
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
