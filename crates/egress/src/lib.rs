//! Egress checks without I/O (docs/capability-grants.md, "Egress").
