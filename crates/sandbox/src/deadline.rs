//! Reading a stream against one overall deadline: a read timeout alone applies to each
//! read, so a peer sending a byte every few seconds would never time out.

use std::io::{self, Read};
use std::os::unix::net::UnixStream;
use std::time::Instant;

/// Reads from `stream` until `deadline`, however the bytes trickle in; past it every read
/// fails with [`io::ErrorKind::TimedOut`]. Leaves the stream's read timeout set.
#[derive(Debug)]
pub struct DeadlineReader<'a> {
    stream: &'a UnixStream,
    deadline: Instant,
}

impl<'a> DeadlineReader<'a> {
    /// Reads from `stream` until `deadline`.
    pub fn new(stream: &'a UnixStream, deadline: Instant) -> Self {
        DeadlineReader { stream, deadline }
    }
}

impl Read for DeadlineReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::ErrorKind::TimedOut.into());
        }
        self.stream.set_read_timeout(Some(left))?;
        let mut s = self.stream;
        match s.read(buf) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Err(io::ErrorKind::TimedOut.into()),
            other => other,
        }
    }
}
