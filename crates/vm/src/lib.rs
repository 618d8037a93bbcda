//! The VM provider (`qemu`): each run is one fresh QEMU microVM with its own guest kernel,
//! jailed on the host, destroyed when the run ends. Its tier comes from the accelerator QEMU
//! reports for the probe guest: KVM is `vm`, TCG is `kernel` ([`tier::tier_for`]).
//!
//! - [`config`]: the configuration ([`VmConfig`]) and its defaults.
//! - [`assets`]: the kernel, initramfs and image disk scripts/build-vm-assets builds, and the
//!   run initramfs (base + the tools archive).
//! - [`qemu`]: QEMU's and the guest kernel's command lines.
//! - [`jail`]: QEMU's mount namespace, uid, rlimits and parent-death signal.
//! - [`channel`]: the framed host–guest protocol over the virtio-serial port (the guest-init
//!   crate's, shared with the guest).
//! - [`boot`]: one VM's life, from run directory to teardown.
//! - [`provider`]: the provider itself, [`VmProvider`].
//! - [`session`]: a session's VM ([`session::VmSession`]), its agent's calls relayed over
//!   the channel.
//! - [`probe`]: the startup probe and its checks.
//! - [`tier`]: the tier rule.
//! - [`guest`]: where things are in the guest (the guest-init crate's layout; the guest's
//!   PID 1, `plimsoll-guest-init`, is a crate of its own).
//! - [`cpio`]: the newc archive writer.
//!
//! docs/vm-tier.md describes the policy these modules apply.

pub mod assets;
pub mod boot;
pub mod config;
pub mod cpio;
pub mod jail;
pub mod probe;
pub mod provider;
pub mod qemu;
pub mod session;
pub mod tier;

pub use plimsoll_guest_init::channel;
pub use plimsoll_guest_init::layout as guest;

pub use config::{AccelChoice, VmConfig};
pub use provider::{ReapReport, RunStats, VmProvider};
pub use tier::{Accelerator, tier_for};
