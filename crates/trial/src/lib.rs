//! The trial runner: a controller program (JavaScript or Python, as an unprivileged uid of its
//! own) drives a simulator (a WebAssembly module of the `plimsoll-sim/1` ABI, from the image,
//! run by wasmtime) one tick at a time, and the runner records the trajectory and its SHA-256
//! fingerprint. docs/trials.md and docs/simulators.md are the contract.
//!
//! The binary (`plimsoll-trial-runner`) parses the command line; everything else is here.

pub mod controller;
pub mod creds;
pub mod index;
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
pub use sim::{Metadata, SimulatorModule};
pub use verdict::{EndReason, TrialVerdict, Verdict};
