//! The official Rust client of plimsolld.
