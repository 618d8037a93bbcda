//! What a streamed answer (`Accept: application/x-ndjson` on runs, cells and steps) may hold
//! in the daemon while its client reads slowly or not at all (docs/daemon.md, "Streaming").
//!
//! A stream's preview (its output chunks and keep-alive lines) queued for the client is
//! bounded: past [`PREVIEW_HELD`] bytes not yet taken by the client, further chunks are
//! dropped, never waited for, so a run's output is read at its own pace and its deadline
//! holds. A dropped chunk shows as a gap in the next chunk's `offset`; the final answer,
//! which always follows, is whole. A stream also holds a place of its caller's until the
//! client has taken its last line or gone: at most `max_concurrent` streams in all and
//! `max_per_caller` per caller, so what streams hold is bounded per caller and in all even
//! after their runs have ended and freed their run places.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Bytes of preview lines one stream may have queued for its client.
pub(crate) const PREVIEW_HELD: usize = 1024 * 1024;

/// Streams being delivered, in all and per caller.
#[derive(Debug)]
pub(crate) struct Deliveries {
    max_total: usize,
    max_per_caller: usize,
    held: Mutex<Held>,
}

#[derive(Debug, Default)]
struct Held {
    total: usize,
    per_caller: HashMap<String, usize>,
}

/// A stream's place, given back when dropped (its body ended, or its client went away).
#[derive(Debug)]
pub(crate) struct Place {
    deliveries: Arc<Deliveries>,
    caller: String,
}

impl Deliveries {
    pub(crate) fn new(max_total: usize, max_per_caller: usize) -> Arc<Self> {
        Arc::new(Deliveries {
            max_total,
            max_per_caller,
            held: Mutex::new(Held::default()),
        })
    }

    fn held(&self) -> std::sync::MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A place for one more stream of `caller`, or why there is none.
    pub(crate) fn take(self: &Arc<Self>, caller: &str) -> Result<Place, String> {
        let mut held = self.held();
        let mine = held.per_caller.get(caller).copied().unwrap_or(0);
        if mine >= self.max_per_caller {
            return Err(format!(
                "this caller already has {mine} streamed answers being delivered (at most {}); nothing ran: read them, or retry without streaming",
                self.max_per_caller
            ));
        }
        if held.total >= self.max_total {
            return Err(format!(
                "{} streamed answers are being delivered (at most {}); nothing ran: retry later",
                held.total, self.max_total
            ));
        }
        held.total += 1;
        *held.per_caller.entry(caller.to_owned()).or_default() += 1;
        Ok(Place {
            deliveries: Arc::clone(self),
            caller: caller.to_owned(),
        })
    }

    /// Streams being delivered now.
    pub(crate) fn in_flight(&self) -> usize {
        self.held().total
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut held = self.deliveries.held();
        held.total = held.total.saturating_sub(1);
        if let Some(n) = held.per_caller.get_mut(&self.caller) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                held.per_caller.remove(&self.caller);
            }
        }
    }
}

/// The receiving side: the response body's lines.
#[derive(Debug)]
pub(crate) struct Inbox {
    rx: tokio::sync::mpsc::UnboundedReceiver<(Vec<u8>, bool)>,
    queued: Arc<AtomicUsize>,
    /// Held until the body is dropped.
    _place: Place,
}

/// One stream's two ends, holding `place` until its body is dropped.
pub(crate) fn channel(place: Place) -> (Outbox, Inbox) {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let queued = Arc::new(AtomicUsize::new(0));
    (
        Outbox {
            tx,
            queued: Arc::clone(&queued),
        },
        Inbox {
            rx,
            queued,
            _place: place,
        },
    )
}

/// The sending side of one stream's lines (each marked preview or last).
#[derive(Debug, Clone)]
pub(crate) struct Outbox {
    tx: tokio::sync::mpsc::UnboundedSender<(Vec<u8>, bool)>,
    /// Bytes of preview lines sent and not yet taken by the client.
    queued: Arc<AtomicUsize>,
}

impl Outbox {
    /// Queues a preview line (a chunk, a keep-alive) unless the stream already holds
    /// [`PREVIEW_HELD`] bytes its client has not taken: then it is dropped. False when it
    /// was dropped or the client is gone.
    pub(crate) fn preview(&self, line: Vec<u8>) -> bool {
        let len = line.len();
        let before = self.queued.fetch_add(len, Ordering::SeqCst);
        if before.saturating_add(len) > PREVIEW_HELD {
            self.queued.fetch_sub(len, Ordering::SeqCst);
            return false;
        }
        if self.tx.send((line, true)).is_err() {
            self.queued.fetch_sub(len, Ordering::SeqCst);
            return false;
        }
        true
    }

    /// Queues the last line (the answer or the error): always, since it is bounded by the
    /// call's own caps and the stream's place bounds how many there are.
    pub(crate) fn last(&self, line: Vec<u8>) {
        let _ = self.tx.send((line, false));
    }

    /// Resolves once the client is gone (the body dropped).
    pub(crate) async fn closed(&self) {
        self.tx.closed().await;
    }

    /// Bytes of preview queued now.
    #[cfg(test)]
    fn queued(&self) -> usize {
        self.queued.load(Ordering::SeqCst)
    }
}

impl futures_core::Stream for Inbox {
    type Item = Result<axum::body::Bytes, std::convert::Infallible>;
    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        self.rx.poll_recv(cx).map(|line| {
            line.map(|(l, preview)| {
                if preview {
                    self.queued.fetch_sub(l.len(), Ordering::SeqCst);
                }
                Ok(axum::body::Bytes::from(l))
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_are_bounded_per_caller_and_in_all_and_given_back() {
        let d = Deliveries::new(3, 2);
        let a1 = d.take("a").unwrap();
        let _a2 = d.take("a").unwrap();
        assert!(d.take("a").unwrap_err().contains("at most 2"));
        let _b1 = d.take("b").unwrap();
        assert!(d.take("c").unwrap_err().contains("at most 3"));
        drop(a1);
        assert_eq!(d.in_flight(), 2);
        let _c1 = d.take("c").unwrap();
        assert_eq!(d.in_flight(), 3);
    }

    #[test]
    fn a_preview_no_one_reads_stops_at_its_bound_and_the_last_line_still_goes() {
        let d = Deliveries::new(1, 1);
        let (out, mut inbox) = channel(d.take("a").unwrap());
        let line = vec![b'x'; 64 * 1024];
        let mut sent = 0;
        for _ in 0..1000 {
            if out.preview(line.clone()) {
                sent += 1;
            }
        }
        assert_eq!(sent, PREVIEW_HELD / line.len());
        assert_eq!(out.queued(), PREVIEW_HELD);
        out.last(vec![b'y'; 10 * PREVIEW_HELD]);
        // The client takes one line: room for one more.
        let first = inbox.rx.try_recv().unwrap();
        inbox.queued.fetch_sub(first.0.len(), Ordering::SeqCst);
        assert!(out.preview(line.clone()));
        assert!(!out.preview(line));
        drop(inbox);
        assert_eq!(d.in_flight(), 0, "a dropped body gives its place back");
    }
}
