//! `plimsoll-guest-init`: PID 1 of a plimsoll VM guest (see `plimsoll_guest_init::init`). Not for
//! use on a host: it mounts file systems and powers the machine off.

fn main() {
    if std::process::id() != 1 {
        eprintln!(
            "plimsoll-guest-init: this is the init of a plimsoll VM guest (PID 1); it does nothing elsewhere"
        );
        std::process::exit(2);
    }
    plimsoll_guest_init::init::main()
}
