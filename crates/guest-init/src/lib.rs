//! The guest's PID 1 (`plimsoll-guest-init`) and what the host shares with it: the framed
//! host–guest protocol over the virtio-serial port ([`channel`]) and where things are in the
//! guest ([`layout`]). The host side (the vm crate) uses only those two; [`init`] runs
//! inside the guest, as root, and nothing of it is trusted by the host. Its system calls
//! that need `unsafe` are plimsoll-sys's.

pub mod channel;
pub mod init;
pub mod layout;
