//! What the property-based fuzz tests share (crates/{wire,broker,agent,attest,engine}/tests/
//! fuzz.rs): the run configuration (cases from `PROPTEST_CASES`, failures kept beside each
//! test file and replayed first), a strategy for tiers, and one for a valid JSON body mutated
//! byte by byte and with pieces of JSON syntax spliced in.

#![allow(
    dead_code,
    reason = "each crate's fuzz test uses a different part of this module"
)]

use plimsoll_wire::Tier;
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;

/// Cases per property: `PROPTEST_CASES` (declared in `plimsoll_env`) or `default`.
pub fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// `cases(default)` cases; failures are kept beside the test file, in
/// `fuzz.proptest-regressions`, and replayed first.
pub fn config(default: u32) -> ProptestConfig {
    ProptestConfig {
        cases: cases(default),
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        ..ProptestConfig::default()
    }
}

/// Any tier.
pub fn tier() -> impl Strategy<Value = Tier> {
    proptest::sample::select(&Tier::ALL[..])
}

/// Pieces of JSON syntax that change a body's structure or push a parser's limits.
const PIECES: [&[u8]; 10] = [
    b"null",
    b"{}",
    b"[]",
    b"\"\"",
    b",",
    b"0",
    b"-1",
    b"1e400",
    b"18446744073709551616",
    b"\"\\ud800\"",
];

/// `valid` with one to five edits: a byte replaced, inserted or removed, or a piece of JSON
/// syntax spliced in.
pub fn mutated(valid: &'static str) -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec((any::<prop::sample::Index>(), 0u8..4, any::<u8>()), 1..6).prop_map(
        move |edits| {
            let mut body = valid.as_bytes().to_vec();
            for (at, op, byte) in edits {
                let i = at.index(body.len() + 1);
                match op {
                    0 if i < body.len() => body[i] = byte,
                    1 => body.insert(i, byte),
                    2 if i < body.len() => {
                        body.remove(i);
                    }
                    _ => {
                        let piece = PIECES[usize::from(byte) % PIECES.len()];
                        body.splice(i..i, piece.iter().copied());
                    }
                }
            }
            body
        },
    )
}
