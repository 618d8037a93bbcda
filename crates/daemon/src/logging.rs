//! Structured logs: one JSON object per line on stderr, filtered by `PLIMSOLL_LOG`. Log lines
//! carry request ids, caller names, providers and outcomes; never a token, an `Authorization`
//! header or a request body.

use plimsoll_env as env;
use tracing_subscriber::EnvFilter;

/// The filter used when `PLIMSOLL_LOG` is unset.
pub const DEFAULT_FILTER: &str = "info";

/// Installs the JSON subscriber for the whole process. Call once, from a binary.
pub fn init() {
    let wanted = env::get(env::PLIMSOLL_LOG).unwrap_or_else(|| DEFAULT_FILTER.to_owned());
    let filter = EnvFilter::try_new(&wanted).unwrap_or_else(|e| {
        eprintln!(
            "plimsolld: PLIMSOLL_LOG `{wanted}` is not a valid filter ({e}); using `{DEFAULT_FILTER}`"
        );
        EnvFilter::new(DEFAULT_FILTER)
    });
    tracing_subscriber::fmt()
        .json()
        .flatten_event(true)
        .with_current_span(false)
        .with_span_list(false)
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}
