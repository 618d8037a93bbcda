//! The trial runner: a controller program (JavaScript or Python, as an unprivileged uid of its
//! own) drives a simulator (a WebAssembly module run by wasmtime) one tick at a time, and the
//! runner records the trajectory and its SHA-256 fingerprint. docs/trials.md is the contract.
//!
//! The binary (`plimsoll-trial-runner`) parses the command line; everything else is here.

pub mod controller;
pub mod creds;
pub mod launcher;
pub mod protocol;
pub mod report;
pub mod runner;
pub mod scenario;
pub mod sim;
pub mod trajectory;
pub mod trial;
pub mod verdict;

pub use runner::{RunConfig, RunError, SimSource, run};
pub use sim::{SimulatorModule, State};
pub use verdict::{EndReason, TrialVerdict, Verdict};

/// The cart-pole simulator, built from sims/cartpole/cartpole.c by build.rs.
pub const CARTPOLE_WASM: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/cartpole.wasm"));
