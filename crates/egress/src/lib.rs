//! Egress checks without I/O (docs/capability-grants.md, "Egress"): everything the broker
//! parses and decides when sandboxed code asks it, as an HTTP proxy, to reach a host. The
//! broker does the resolving, connecting and splicing; this crate reads bytes and answers.
//!
//! - [`target`]: hosts, ports and request targets. A host is a normalized DNS name or an IP
//!   address; every other spelling a resolver might read as an address (`127.1`,
//!   `0x7f.0.0.1`, `2130706433`...) is refused as an IP literal rather than guessed at, and
//!   an IPv4-mapped IPv6 address is its IPv4 address. `CONNECT` authorities, absolute-form
//!   `http://` URIs (never `https://`: TLS goes through CONNECT) and Host fields are read
//!   here.
//! - [`rules`]: the operator's rules. Host patterns (`example.com`, `*.example.com`, which
//!   never matches `example.com` itself), address ranges, and the class of an address:
//!   only a public address may be reached without an allowed range ([`rules::check_address`]).
//!   Addresses that carry an IPv4 address (mapped, NAT64, 6to4) are classed by it.
//! - [`sni`]: the server name in the TLS ClientHello that a client sends first through a
//!   CONNECT tunnel, reassembled from records and parsed in full, so a name other than the
//!   CONNECT host (domain fronting), a missing one, or a malformed hello can be refused.
//! - [`http1`]: plain HTTP/1 heads (size and field-count limits, CRLF only), body framing
//!   that refuses every ambiguous Transfer-Encoding/Content-Length combination, a chunked
//!   body scanner that finds a body's end in bytes fed at any split, the Host check on every
//!   request, and the request head rewritten in origin form without hop-by-hop fields.
//!
//! Nothing here opens a socket, reads a file or resolves a name, and no input panics.

#![forbid(unsafe_code)]

pub mod http1;
pub mod rules;
pub mod sni;
pub mod target;

/// The test builders tests/fuzz.rs uses too (TLS records, ClientHellos, chunked bodies).
#[cfg(test)]
#[path = "../tests/support/mod.rs"]
mod test_support;
