//! The agent's own wall: what /proc shows of it (identity, capabilities, no_new_privs,
//! seccomp, namespaces, root, interfaces, cgroup limits), said before a job is known
//! (`--wall-first`) and again on a session's `wall` call.

use plimsoll_wire::Wall;

/// The agent could not read its own wall.
#[derive(Debug, thiserror::Error)]
#[error("cannot read its own wall")]
pub struct ReadOwnWallError(#[source] std::io::Error);

/// This process's wall, as its /proc shows it now.
pub fn own_wall() -> Result<Wall, ReadOwnWallError> {
    let layout = plimsoll_sandbox::cgroup::CgroupLayout::detect().map_err(ReadOwnWallError)?;
    plimsoll_sandbox::wall::read_unmarked(std::process::id(), &layout).map_err(ReadOwnWallError)
}
