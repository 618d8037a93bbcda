//! What the broker's benches share: an API call as a sandbox sends it on its channel.

use std::io::{Read as _, Write as _};
use std::os::unix::net::UnixStream;

/// `GET /orders/ID` through the broker on `s`: one frame out, one back, which must say 200.
pub fn brokered_call(s: &mut UnixStream, id: u64) {
    let msg = format!(r#"{{"id":{id},"method":"GET","path":"/orders/{id}"}}"#);
    let mut frame = (msg.len() as u32).to_be_bytes().to_vec();
    frame.extend_from_slice(msg.as_bytes());
    s.write_all(&frame).unwrap();
    let mut len = [0u8; 4];
    s.read_exact(&mut len).unwrap();
    let mut reply = vec![0u8; u32::from_be_bytes(len) as usize];
    s.read_exact(&mut reply).unwrap();
    assert!(
        reply.windows(12).any(|w| w == br#""status":200"#),
        "{}",
        String::from_utf8_lossy(&reply)
    );
}
