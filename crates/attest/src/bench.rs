//! A timing loop for the hidden `bench` subcommand: signing and verifying throughput and the
//! size of an entry, as medians over rounds. Figures only; no test asserts on them.

use std::path::Path;
use std::time::Instant;

use crate::bundle::{append_entry, close_bundle, sign_exchange};
use crate::keys::AttestKey;
use crate::sample::sample_exchange;
use crate::statement::GENESIS_SHA256;
use crate::verify::verify_bundle_bytes;

/// Medians over the rounds.
#[derive(Debug, Clone)]
pub struct BenchReport {
    /// Entries per round.
    pub entries: u64,
    /// Rounds.
    pub rounds: u32,
    /// In-memory signing (check, statement, signature, read-back check), entries per second.
    pub sign_per_sec: f64,
    /// Appending to a bundle file (lock, tail, sign, write, fsync), entries per second.
    pub append_per_sec: f64,
    /// Verifying a closed bundle from memory, entries per second.
    pub verify_per_sec: f64,
    /// Bytes of one entry line (newline included) for a trivial snippet.
    pub entry_bytes: usize,
    /// Bytes of the close line.
    pub close_bytes: usize,
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// Runs the loop in `dir` (bundles are written there and removed).
pub fn run_bench(dir: &Path, entries: u64, rounds: u32) -> std::io::Result<BenchReport> {
    let key = AttestKey::from_seed(&[42; 32]);
    let exchanges: Vec<_> = (0..entries).map(sample_exchange).collect();
    let (mut sign, mut append, mut verify) = (Vec::new(), Vec::new(), Vec::new());
    let (mut entry_bytes, mut close_bytes) = (0, 0);
    for round in 0..rounds {
        let t = Instant::now();
        for (i, ex) in exchanges.iter().enumerate() {
            sign_exchange(&key, ex, i as u64, GENESIS_SHA256).map_err(std::io::Error::other)?;
        }
        sign.push(entries as f64 / t.elapsed().as_secs_f64());

        let path = dir.join(format!("bench-{round}.bundle"));
        let t = Instant::now();
        for ex in &exchanges {
            entry_bytes = append_entry(&path, &key, ex)
                .map_err(std::io::Error::other)?
                .bytes;
        }
        append.push(entries as f64 / t.elapsed().as_secs_f64());
        close_bytes = close_bundle(&path, &key)
            .map_err(std::io::Error::other)?
            .bytes;

        let bytes = std::fs::read(&path)?;
        std::fs::remove_file(&path)?;
        let t = Instant::now();
        verify_bundle_bytes(&bytes, key.public()).map_err(std::io::Error::other)?;
        verify.push(entries as f64 / t.elapsed().as_secs_f64());
    }
    Ok(BenchReport {
        entries,
        rounds,
        sign_per_sec: median(sign),
        append_per_sec: median(append),
        verify_per_sec: median(verify),
        entry_bytes,
        close_bytes,
    })
}
