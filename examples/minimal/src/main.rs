//! The smallest use of plimsoll.

fn main() {}
