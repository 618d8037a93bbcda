//! The oracle example: not written yet.

fn main() {}
