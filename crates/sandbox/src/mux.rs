//! Many byte streams over one: how a VM's egress connections share its one egress port
//! (a virtio-serial port, `plimsoll.egress`). The guest opens a stream for each connection to
//! its proxy endpoint; the host end hands each stream to the run's broker as one channel
//! connection (docs/vm-tier.md, "Egress").
//!
//! A frame is a stream id (u32, big-endian), a type (u8), a length (u32, big-endian) and that
//! many bytes: `OPEN` (guest to host, empty), `DATA` (at most [`MAX_DATA`] bytes), `EOF` (the
//! sender sends no more on that stream), `CLOSE` (the stream is gone, both ways), `CREDIT`
//! (4 bytes: the receiver wrote that many more bytes of the stream out, so the sender may
//! send that many more). Each side may have at most [`WINDOW`] bytes of a stream in flight
//! that the other side has not credited back, so one stream whose reader stalls never stalls
//! the port: the reading side queues at most a window per stream and never blocks. A peer
//! that sends past the window, an unknown type, an oversized frame or more than
//! [`MAX_STREAMS`] streams at once breaks the protocol, and the whole mux ends.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// A new stream (guest to host).
pub const OPEN: u8 = 1;
/// Bytes of a stream.
pub const DATA: u8 = 2;
/// The sender sends no more bytes on the stream.
pub const EOF: u8 = 3;
/// The stream is gone, both ways.
pub const CLOSE: u8 = 4;
/// The receiver wrote this many more bytes out: the sender may send as many more.
pub const CREDIT: u8 = 5;
/// The most bytes one `DATA` frame carries.
pub const MAX_DATA: usize = 32 * 1024;
/// Bytes of one stream a side may have in flight, not yet credited back.
pub const WINDOW: u32 = 256 * 1024;
/// Streams open at once.
pub const MAX_STREAMS: usize = 64;

/// One end of a stream: a connected socket, read by one thread and written by another.
pub trait Socket: Send + Sync + 'static {
    /// Reads some bytes; 0 at end of stream.
    fn read_some(&self, buf: &mut [u8]) -> io::Result<usize>;
    /// Writes all of `bytes`.
    fn write_all_of(&self, bytes: &[u8]) -> io::Result<()>;
    /// Shuts one or both directions down.
    fn shut(&self, how: Shutdown);
}

impl Socket for TcpStream {
    fn read_some(&self, buf: &mut [u8]) -> io::Result<usize> {
        (&*self).read(buf)
    }
    fn write_all_of(&self, bytes: &[u8]) -> io::Result<()> {
        (&*self).write_all(bytes)
    }
    fn shut(&self, how: Shutdown) {
        let _ = self.shutdown(how);
    }
}

impl Socket for UnixStream {
    fn read_some(&self, buf: &mut [u8]) -> io::Result<usize> {
        (&*self).read(buf)
    }
    fn write_all_of(&self, bytes: &[u8]) -> io::Result<()> {
        (&*self).write_all(bytes)
    }
    fn shut(&self, how: Shutdown) {
        let _ = self.shutdown(how);
    }
}

/// What the port's reader hands a stream's writer.
enum Inbound {
    Data(Vec<u8>),
    Eof,
}

struct Stream {
    socket: Arc<dyn Socket>,
    /// Bytes this side may still send.
    credit: Mutex<u32>,
    credit_changed: Condvar,
    /// Bytes received, not yet written out and credited back.
    queued: Mutex<u32>,
    inbound: Mutex<Option<Sender<Inbound>>>,
    /// Set once the stream is closed: both threads stop.
    closed: Mutex<bool>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One side of a mux over one port.
pub struct Mux {
    out: Mutex<Box<dyn Write + Send>>,
    streams: Mutex<HashMap<u32, Arc<Stream>>>,
    next: AtomicU32,
}

impl std::fmt::Debug for Mux {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mux")
            .field("streams", &lock(&self.streams).len())
            .finish()
    }
}

/// The peer broke the protocol, or the port failed.
#[derive(Debug, thiserror::Error)]
pub enum MuxError {
    /// Reading the port failed.
    #[error("the port failed: {0}")]
    Port(#[from] io::Error),
    /// The peer sent what the protocol does not allow.
    #[error("the peer broke the protocol: {0}")]
    Protocol(&'static str),
}

impl Mux {
    /// A mux writing its frames to `out`.
    pub fn new(out: Box<dyn Write + Send>) -> Arc<Mux> {
        Arc::new(Mux {
            out: Mutex::new(out),
            streams: Mutex::new(HashMap::new()),
            next: AtomicU32::new(1),
        })
    }

    fn send(&self, id: u32, kind: u8, payload: &[u8]) -> io::Result<()> {
        let mut frame = Vec::with_capacity(9 + payload.len());
        frame.extend_from_slice(&id.to_be_bytes());
        frame.push(kind);
        frame.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        frame.extend_from_slice(payload);
        let mut out = lock(&self.out);
        out.write_all(&frame)?;
        out.flush()
    }

    /// Opens a stream for `socket` (the side that accepts connections: the guest). `Err`
    /// when [`MAX_STREAMS`] are open or the port failed; the socket is then shut.
    pub fn open(self: &Arc<Self>, socket: Arc<dyn Socket>) -> io::Result<()> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        if lock(&self.streams).len() >= MAX_STREAMS {
            socket.shut(Shutdown::Both);
            return Err(io::Error::other("too many streams open at once"));
        }
        self.attach(id, socket, true).map(|_| ())
    }

    /// Registers stream `id` for `socket`, says `OPEN` first when `announce` (so no `DATA`
    /// of it can reach the peer before), and starts its two threads.
    fn attach(
        self: &Arc<Self>,
        id: u32,
        socket: Arc<dyn Socket>,
        announce: bool,
    ) -> io::Result<Arc<Stream>> {
        let (tx, rx) = channel();
        let stream = Arc::new(Stream {
            socket,
            credit: Mutex::new(WINDOW),
            credit_changed: Condvar::new(),
            queued: Mutex::new(0),
            inbound: Mutex::new(Some(tx)),
            closed: Mutex::new(false),
        });
        lock(&self.streams).insert(id, Arc::clone(&stream));
        if announce && let Err(e) = self.send(id, OPEN, &[]) {
            self.close_local(id, &stream);
            return Err(e);
        }
        let (me, s) = (Arc::clone(self), Arc::clone(&stream));
        let _ = std::thread::Builder::new()
            .name("mux-out".into())
            .spawn(move || me.pump_out(id, &s));
        let (me, s) = (Arc::clone(self), Arc::clone(&stream));
        let _ = std::thread::Builder::new()
            .name("mux-in".into())
            .spawn(move || me.pump_in(id, &s, &rx));
        Ok(stream)
    }

    /// Socket to port: `DATA` within the credit, then `EOF`; `CLOSE` on a failure.
    fn pump_out(&self, id: u32, s: &Stream) {
        let mut buf = vec![0u8; MAX_DATA];
        loop {
            let room = {
                let mut credit = lock(&s.credit);
                while *credit == 0 && !*lock(&s.closed) {
                    credit = s
                        .credit_changed
                        .wait(credit)
                        .unwrap_or_else(|p| p.into_inner());
                }
                if *lock(&s.closed) {
                    return;
                }
                *credit as usize
            };
            match s.socket.read_some(&mut buf[..room.min(MAX_DATA)]) {
                Ok(0) => {
                    let _ = self.send(id, EOF, &[]);
                    return;
                }
                Ok(n) => {
                    *lock(&s.credit) -= n as u32;
                    if self.send(id, DATA, &buf[..n]).is_err() {
                        return;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    if !*lock(&s.closed) {
                        let _ = self.send(id, CLOSE, &[]);
                        self.close_local(id, s);
                    }
                    return;
                }
            }
        }
    }

    /// Port to socket: what the reader queued, credited back once written.
    fn pump_in(&self, id: u32, s: &Stream, rx: &Receiver<Inbound>) {
        while let Ok(msg) = rx.recv() {
            match msg {
                Inbound::Data(bytes) => {
                    if s.socket.write_all_of(&bytes).is_err() {
                        let _ = self.send(id, CLOSE, &[]);
                        self.close_local(id, s);
                        return;
                    }
                    *lock(&s.queued) -= bytes.len() as u32;
                    if self
                        .send(id, CREDIT, &(bytes.len() as u32).to_be_bytes())
                        .is_err()
                    {
                        return;
                    }
                }
                Inbound::Eof => s.socket.shut(Shutdown::Write),
            }
        }
    }

    /// Forgets stream `id` and shuts its socket; its threads end.
    fn close_local(&self, id: u32, s: &Stream) {
        *lock(&s.closed) = true;
        {
            // Under the credit's lock, so a writer between its check and its wait is woken.
            let _credit = lock(&s.credit);
            s.credit_changed.notify_all();
        }
        lock(&s.inbound).take();
        s.socket.shut(Shutdown::Both);
        lock(&self.streams).remove(&id);
    }

    /// Reads the port's frames until it ends or the peer breaks the protocol; every stream is
    /// closed then. `accept` makes the socket of a stream the peer opened (`None` refuses
    /// it); a side that only opens streams passes one that refuses.
    pub fn serve(
        self: &Arc<Self>,
        mut port: impl Read,
        accept: impl Fn() -> Option<Arc<dyn Socket>>,
    ) -> Result<(), MuxError> {
        let ended = self.read_frames(&mut port, &accept);
        let open: Vec<(u32, Arc<Stream>)> = lock(&self.streams).drain().collect();
        for (id, s) in open {
            self.close_local(id, &s);
        }
        ended
    }

    fn read_frames(
        self: &Arc<Self>,
        port: &mut impl Read,
        accept: &impl Fn() -> Option<Arc<dyn Socket>>,
    ) -> Result<(), MuxError> {
        loop {
            let mut head = [0u8; 9];
            match port.read_exact(&mut head) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
                Err(e) => return Err(e.into()),
            }
            let id = u32::from_be_bytes([head[0], head[1], head[2], head[3]]);
            let kind = head[4];
            let len = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) as usize;
            if len > MAX_DATA {
                return Err(MuxError::Protocol("a frame over the size limit"));
            }
            let mut payload = vec![0u8; len];
            port.read_exact(&mut payload)?;
            let stream = lock(&self.streams).get(&id).cloned();
            match (kind, stream) {
                (OPEN, Some(_)) => return Err(MuxError::Protocol("a stream opened twice")),
                (OPEN, None) => {
                    if lock(&self.streams).len() >= MAX_STREAMS {
                        self.send(id, CLOSE, &[])?;
                        continue;
                    }
                    match accept() {
                        Some(socket) => {
                            self.attach(id, socket, false)?;
                        }
                        None => self.send(id, CLOSE, &[])?,
                    }
                }
                (DATA, Some(s)) => {
                    let mut queued = lock(&s.queued);
                    if *queued as usize + len > WINDOW as usize {
                        return Err(MuxError::Protocol("data past the window"));
                    }
                    *queued += len as u32;
                    drop(queued);
                    if let Some(tx) = lock(&s.inbound).as_ref() {
                        let _ = tx.send(Inbound::Data(payload));
                    }
                }
                (EOF, Some(s)) => {
                    if let Some(tx) = lock(&s.inbound).take() {
                        let _ = tx.send(Inbound::Eof);
                    }
                }
                (CLOSE, Some(s)) => self.close_local(id, &s),
                (CREDIT, Some(s)) => {
                    let more = payload
                        .try_into()
                        .map(u32::from_be_bytes)
                        .map_err(|_| MuxError::Protocol("a credit that is not 4 bytes"))?;
                    let mut credit = lock(&s.credit);
                    *credit = credit
                        .checked_add(more)
                        .filter(|c| *c <= WINDOW)
                        .ok_or(MuxError::Protocol("credit past the window"))?;
                    s.credit_changed.notify_all();
                }
                // A frame for a stream already closed here: it crossed the CLOSE.
                (DATA | EOF | CLOSE | CREDIT, None) => {}
                _ => return Err(MuxError::Protocol("an unknown frame type")),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two muxes joined by a socketpair: the guest side opens, the host side accepts each
    /// stream into a fresh socketpair whose other end the test gets.
    fn pair() -> (Arc<Mux>, std::sync::mpsc::Receiver<UnixStream>) {
        let (g, h) = UnixStream::pair().unwrap();
        let guest = Mux::new(Box::new(g.try_clone().unwrap()));
        let host = Mux::new(Box::new(h.try_clone().unwrap()));
        let (tx, rx) = channel();
        let tx = Mutex::new(tx);
        std::thread::spawn(move || {
            host.serve(h, || {
                let (a, b) = UnixStream::pair().ok()?;
                lock(&tx).send(b).ok()?;
                Some(Arc::new(a) as Arc<dyn Socket>)
            })
        });
        let g2 = Arc::clone(&guest);
        std::thread::spawn(move || g2.serve(g, || None));
        (guest, rx)
    }

    #[test]
    fn streams_carry_bytes_both_ways_and_end_cleanly() {
        let (guest, accepted) = pair();
        let mut ends = Vec::new();
        for i in 0..3u8 {
            let (app, inner) = UnixStream::pair().unwrap();
            guest.open(Arc::new(inner)).unwrap();
            let far = accepted.recv().unwrap();
            // More than a window each way, so credits must flow.
            let up = vec![i; 3 * WINDOW as usize / 2];
            let mut w = app.try_clone().unwrap();
            let up2 = up.clone();
            let writer = std::thread::spawn(move || {
                w.write_all(&up2).unwrap();
                w.shutdown(Shutdown::Write).unwrap();
            });
            let mut got = Vec::new();
            (&far).read_to_end(&mut got).unwrap();
            writer.join().unwrap();
            assert_eq!(got, up, "stream {i} up");
            // Written from its own thread too: the path holds a window plus two socket
            // buffers, less than this, so a writer that reads only afterwards never ends.
            let mut w = far.try_clone().unwrap();
            let writer = std::thread::spawn(move || {
                w.write_all(&vec![i + 100; 600_000]).unwrap();
                w.shutdown(Shutdown::Write).unwrap();
            });
            let mut back = Vec::new();
            (&app).read_to_end(&mut back).unwrap();
            writer.join().unwrap();
            assert_eq!(back, vec![i + 100; 600_000], "stream {i} down");
            ends.push((app, far));
        }
    }

    #[test]
    fn bytes_written_before_the_open_is_sent_are_not_lost() {
        let (guest, accepted) = pair();
        for _ in 0..50 {
            let (app, inner) = UnixStream::pair().unwrap();
            // The application speaks first, before the stream is even opened.
            (&app).write_all(b"CONNECT x:443 HTTP/1.1\r\n\r\n").unwrap();
            app.shutdown(Shutdown::Write).unwrap();
            guest.open(Arc::new(inner)).unwrap();
            let far = accepted.recv().unwrap();
            let mut got = Vec::new();
            (&far).read_to_end(&mut got).unwrap();
            assert_eq!(got, b"CONNECT x:443 HTTP/1.1\r\n\r\n");
        }
    }

    #[test]
    fn a_stalled_stream_does_not_stall_the_others() {
        let (guest, accepted) = pair();
        let (stalled_app, inner) = UnixStream::pair().unwrap();
        guest.open(Arc::new(inner)).unwrap();
        let stalled_far = accepted.recv().unwrap();
        // The far end writes far more than a window plus the socket buffers; nobody reads.
        let filler = std::thread::spawn(move || {
            let _ = (&stalled_far).write_all(&vec![1u8; 8 << 20]);
            stalled_far
        });
        std::thread::sleep(std::time::Duration::from_millis(300));
        let (app, inner) = UnixStream::pair().unwrap();
        guest.open(Arc::new(inner)).unwrap();
        let far = accepted.recv().unwrap();
        (&far).write_all(b"still moving").unwrap();
        far.shutdown(Shutdown::Write).unwrap();
        let mut got = Vec::new();
        (&app).read_to_end(&mut got).unwrap();
        assert_eq!(got, b"still moving");
        drop(stalled_app);
        drop(filler);
    }

    /// A socket whose reader and writer both block until it is shut: the side it stands for
    /// never reads what it is sent.
    struct Stuck(Mutex<bool>, Condvar);

    impl Socket for Stuck {
        fn read_some(&self, _: &mut [u8]) -> io::Result<usize> {
            let mut shut = lock(&self.0);
            while !*shut {
                shut = self.1.wait(shut).unwrap();
            }
            Ok(0)
        }
        fn write_all_of(&self, _: &[u8]) -> io::Result<()> {
            self.read_some(&mut []).map(|_| ())
        }
        fn shut(&self, _: Shutdown) {
            *lock(&self.0) = true;
            self.1.notify_all();
        }
    }

    #[test]
    fn a_peer_past_the_window_ends_the_mux() {
        let (g, h) = UnixStream::pair().unwrap();
        let host = Mux::new(Box::new(h.try_clone().unwrap()));
        let server = std::thread::spawn(move || {
            host.serve(h, || {
                Some(Arc::new(Stuck(Mutex::new(false), Condvar::new())) as Arc<dyn Socket>)
            })
        });
        let frame = |id: u32, kind: u8, payload: &[u8]| {
            let mut f = id.to_be_bytes().to_vec();
            f.push(kind);
            f.extend_from_slice(&(payload.len() as u32).to_be_bytes());
            f.extend_from_slice(payload);
            f
        };
        let writer = std::thread::spawn(move || {
            let mut w = &g;
            w.write_all(&frame(7, OPEN, &[])).unwrap();
            // One frame more than the window, none of it credited: the receiver's socket
            // takes nothing.
            let chunk = vec![0u8; MAX_DATA];
            for _ in 0..=(WINDOW as usize / MAX_DATA) {
                if w.write_all(&frame(7, DATA, &chunk)).is_err() {
                    break;
                }
            }
            g
        });
        let ended = server.join().unwrap();
        assert!(
            matches!(ended, Err(MuxError::Protocol("data past the window"))),
            "{ended:?}"
        );
        drop(writer.join().unwrap());
    }
}
