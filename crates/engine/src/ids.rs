//! Fresh ids for runs and warm members.

/// A fresh id for a run (or a warm member): 96 random bits, hex.
pub(crate) fn new_run_id() -> String {
    let bytes: [u8; 12] = rand::random();
    hex::encode(bytes)
}
