//! plimsoll: the command-line interface.

fn main() {}
