//! Skipping a test that needs something real from the host (root, a runtime): the three
//! helpers left here because crates/vm/src/guest.rs's unit tests still name this path.
//! Everything else, and these through a re-export, is in the dev-only `plimsoll-testing`
//! crate; once the guest init has its own crate, these move there too.

/// True when tests run strictly: env `CI` is `true` or `1` (declared as
/// `plimsoll_env::CI`; read here directly because this crate sits below the engine).
pub fn strict() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// Prints `SKIP <test>: <reason>` and returns, or panics with the same text when tests run
/// strictly. Call it, then `return` from the test.
pub fn skip_or_fail(test: &str, reason: &str) {
    if strict() {
        panic!("SKIP not allowed under CI=true: {test}: {reason}");
    }
    eprintln!("SKIP {test}: {reason}");
}

/// True when this process runs as root (many sandbox tests need it).
pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}
