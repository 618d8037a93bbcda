//! One connection of the launcher's socket: frames of a big-endian u32 length and that many
//! bytes of JSON, each sent whole by one `sendmsg`, a descriptor beside it when it carries one.

use std::collections::VecDeque;
use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::Mutex;

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, recvmsg, sendmsg,
};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// The largest frame either side reads: a run's result with every output at its cap fits.
pub const MAX_FRAME: usize = 256 << 20;

/// The sending half; shared by the threads of one request (output, broker ends, the answer).
#[derive(Debug)]
pub struct Sender(Mutex<UnixStream>);

impl Sender {
    /// Sends on `stream`.
    pub fn new(stream: UnixStream) -> Self {
        Sender(Mutex::new(stream))
    }

    /// Shuts the connection down both ways: the peer and this side's reader see its end.
    pub fn shutdown(&self) {
        let _ = self
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .shutdown(std::net::Shutdown::Both);
    }

    /// Sends `message` as one frame, `fd` beside it.
    pub fn send(&self, message: &impl Serialize, fd: Option<BorrowedFd<'_>>) -> io::Result<()> {
        let body = serde_json::to_vec(message).map_err(io::Error::other)?;
        let mut frame = Vec::with_capacity(4 + body.len());
        frame.extend_from_slice(&(body.len() as u32).to_be_bytes());
        frame.extend_from_slice(&body);
        let stream = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let mut rest: &[u8] = &frame;
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut ancillary = SendAncillaryBuffer::new(&mut space);
        let fds: Vec<BorrowedFd<'_>> = fd.into_iter().collect();
        if !fds.is_empty() && !ancillary.push(SendAncillaryMessage::ScmRights(&fds)) {
            return Err(io::Error::other("no room for the descriptor"));
        }
        while !rest.is_empty() {
            let sent = sendmsg(
                stream.as_fd(),
                &[IoSlice::new(rest)],
                &mut ancillary,
                SendFlags::NOSIGNAL,
            );
            match sent {
                Ok(n) => {
                    rest = &rest[n..];
                    // The descriptor went with the first bytes.
                    ancillary.clear();
                }
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }
}

/// The receiving half: frames in order, and the descriptors that came beside them.
#[derive(Debug)]
pub struct Receiver {
    stream: UnixStream,
    buf: Vec<u8>,
    fds: VecDeque<OwnedFd>,
}

impl Receiver {
    /// Receives on `stream`.
    pub fn new(stream: UnixStream) -> Self {
        Receiver {
            stream,
            buf: Vec::new(),
            fds: VecDeque::new(),
        }
    }

    /// The next frame; `None` when the peer closed the connection between frames.
    pub fn recv<T: DeserializeOwned>(&mut self) -> io::Result<Option<T>> {
        loop {
            if self.buf.len() >= 4 {
                let len = u32::from_be_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]])
                    as usize;
                if len > MAX_FRAME {
                    return Err(io::Error::other(format!(
                        "a frame of {len} bytes, over the launcher's limit of {MAX_FRAME}"
                    )));
                }
                if self.buf.len() >= 4 + len {
                    let parsed = serde_json::from_slice(&self.buf[4..4 + len]);
                    self.buf.drain(..4 + len);
                    return parsed
                        .map(Some)
                        .map_err(|e| io::Error::other(format!("an unreadable frame: {e}")));
                }
            }
            let mut chunk = vec![0u8; 64 * 1024];
            let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(4))];
            let mut ancillary = RecvAncillaryBuffer::new(&mut space);
            let got = match recvmsg(
                self.stream.as_fd(),
                &mut [IoSliceMut::new(&mut chunk)],
                &mut ancillary,
                RecvFlags::CMSG_CLOEXEC,
            ) {
                Ok(got) => got,
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            };
            for message in ancillary.drain() {
                if let RecvAncillaryMessage::ScmRights(rights) = message {
                    self.fds.extend(rights);
                }
            }
            if got.bytes == 0 {
                return if self.buf.is_empty() {
                    Ok(None)
                } else {
                    Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the connection ended inside a frame",
                    ))
                };
            }
            self.buf.extend_from_slice(&chunk[..got.bytes]);
        }
    }

    /// The next frame, which must come: the peer closing is an error.
    pub fn expect<T: DeserializeOwned>(&mut self) -> io::Result<T> {
        self.recv()?.ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the launcher's connection ended before its answer",
            )
        })
    }

    /// The descriptor that came with the frame just read.
    pub fn take_fd(&mut self) -> io::Result<OwnedFd> {
        self.fds.pop_front().ok_or_else(|| {
            io::Error::other("a frame that says it carries a descriptor came without one")
        })
    }
}

/// Both halves of `stream`.
pub fn split(stream: UnixStream) -> io::Result<(Sender, Receiver)> {
    Ok((Sender::new(stream.try_clone()?), Receiver::new(stream)))
}
