//! The channel's framing: each message is a 4-byte big-endian length, then that many bytes
//! of UTF-8 JSON (docs/capability-grants.md, "The channel").

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use plimsoll_sandbox::deadline::DeadlineReader;

/// A frame could not be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReadFrameError {
    /// The length is over the cap; the frame's bytes are still in the stream.
    #[error("a frame of {0} bytes is over the cap")]
    TooLarge(u32),
    /// The stream failed or ended inside a frame.
    #[error("the channel failed")]
    Io(#[from] io::Error),
}

/// Reads one frame of at most `max` bytes. `Ok(None)` at a clean end of stream.
pub(crate) fn read_frame(r: &mut impl Read, max: u32) -> Result<Option<Vec<u8>>, ReadFrameError> {
    let mut len = [0u8; 4];
    let mut got = 0;
    while got < len.len() {
        match r.read(&mut len[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(io::Error::from(io::ErrorKind::UnexpectedEof).into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    let len = u32::from_be_bytes(len);
    if len > max {
        return Err(ReadFrameError::TooLarge(len));
    }
    let mut buf = vec![0u8; len as usize];
    r.read_exact(&mut buf)?;
    Ok(Some(buf))
}

/// Reads one frame of at most `max` bytes from a channel, waiting as long as it takes for its
/// first byte (a connection may idle between calls) but no longer than `within` for the whole
/// rest once it began, however slowly it trickles: a frame left unfinished is an error, not a
/// connection held open. A frame over `max` is read and dropped within the same deadline
/// before [`ReadFrameError::TooLarge`] is returned, so the channel is at the next frame.
pub(crate) fn read_frame_within(
    stream: &UnixStream,
    max: u32,
    within: Duration,
) -> Result<Option<Vec<u8>>, ReadFrameError> {
    stream.set_read_timeout(None)?;
    let mut first = [0u8; 1];
    let mut r = stream;
    loop {
        match r.read(&mut first) {
            Ok(0) => return Ok(None),
            Ok(_) => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    let mut rest = DeadlineReader::new(stream, Instant::now() + within);
    match read_frame(&mut io::Cursor::new(first).chain(&mut rest), max) {
        Err(ReadFrameError::TooLarge(len)) => {
            skip(&mut rest, len)?;
            Err(ReadFrameError::TooLarge(len))
        }
        other => other,
    }
}

/// Reads and drops `len` bytes (the body of a frame over the cap).
fn skip(r: &mut impl Read, len: u32) -> io::Result<()> {
    let copied = io::copy(&mut r.take(u64::from(len)), &mut io::sink())?;
    if copied < u64::from(len) {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    Ok(())
}

/// Writes one frame.
pub(crate) fn write_frame(w: &mut impl Write, value: &serde_json::Value) -> io::Result<()> {
    let body = serde_json::to_vec(value).map_err(io::Error::other)?;
    let len = u32::try_from(body.len()).map_err(|_| io::Error::other("frame too large"))?;
    let mut out = Vec::with_capacity(4 + body.len());
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&body);
    w.write_all(&out)?;
    w.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_left_unfinished_ends_the_read() {
        let (a, b) = UnixStream::pair().unwrap();
        let mut w = &a;
        // A whole frame, then the start of one that never ends.
        write_frame(&mut w, &serde_json::json!({"a": 1})).unwrap();
        w.write_all(&[0, 0, 0, 50, b'{']).unwrap();
        let within = Duration::from_millis(200);
        assert_eq!(
            read_frame_within(&b, 100, within).unwrap().unwrap(),
            br#"{"a":1}"#
        );
        match read_frame_within(&b, 100, within) {
            Err(ReadFrameError::Io(e)) => assert!(
                matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ),
                "{e}"
            ),
            other => panic!("an unfinished frame must fail, got {other:?}"),
        }
        drop(a);
        assert!(read_frame_within(&b, 100, within).unwrap().is_none());
    }

    #[test]
    fn a_frame_that_trickles_in_ends_the_read_at_its_deadline() {
        let (a, b) = UnixStream::pair().unwrap();
        // A 100-byte frame, one byte every 50 ms: each read is quick, the frame is not.
        let writer = std::thread::spawn(move || {
            let mut w = &a;
            let _ = w.write_all(&[0, 0, 0, 100]);
            for _ in 0..100 {
                if w.write_all(b" ").is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        let started = Instant::now();
        match read_frame_within(&b, 1000, Duration::from_millis(300)) {
            Err(ReadFrameError::Io(e)) => {
                assert!(
                    matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ),
                    "{e}"
                );
            }
            other => panic!("a trickling frame must fail, got {other:?}"),
        }
        assert!(started.elapsed() < Duration::from_secs(3));
        drop(b);
        writer.join().unwrap();
    }

    #[test]
    fn a_frame_over_the_cap_is_skipped_whole() {
        let (a, b) = UnixStream::pair().unwrap();
        let mut w = &a;
        write_frame(&mut w, &serde_json::json!({"big": "x".repeat(50)})).unwrap();
        write_frame(&mut w, &serde_json::json!({"a": 1})).unwrap();
        let within = Duration::from_secs(5);
        assert!(matches!(
            read_frame_within(&b, 20, within),
            Err(ReadFrameError::TooLarge(_))
        ));
        assert_eq!(
            read_frame_within(&b, 20, within).unwrap().unwrap(),
            br#"{"a":1}"#
        );
    }

    #[test]
    fn frames_round_trip_and_caps_hold() {
        let mut buf = Vec::new();
        write_frame(&mut buf, &serde_json::json!({"a": 1})).unwrap();
        assert_eq!(&buf[..4], &[0, 0, 0, 7]);
        let mut r = &buf[..];
        assert_eq!(read_frame(&mut r, 100).unwrap().unwrap(), br#"{"a":1}"#);
        assert!(read_frame(&mut r, 100).unwrap().is_none(), "clean end");
        let mut r = &buf[..];
        assert!(matches!(
            read_frame(&mut r, 3),
            Err(ReadFrameError::TooLarge(7))
        ));
        skip(&mut r, 7).unwrap();
        assert!(r.is_empty());
        let mut r = &buf[..6];
        assert!(matches!(
            read_frame(&mut r, 100),
            Err(ReadFrameError::Io(_))
        ));
    }
}
