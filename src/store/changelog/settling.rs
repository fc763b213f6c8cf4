//! One write's two confirmations joined: durable here (the group commit) and
//! acknowledged by the broker (the changelog). Each side reports from its own
//! thread (the sync thread, the producer's delivery callback); the writer is
//! woken once, by whichever comes last, not once by each. A cross-thread
//! wake-up of a task costs several µs of CPU on a small machine, and every
//! final record pays it.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};

use crate::store::disk::sync::{OnDurable, SyncResult};
use super::entry::Acked;
use crate::store::error::SendError;

/// What became of one attempt to send a changelog entry.
#[derive(Debug)]
pub enum Delivered {
    /// The broker acknowledged it, here.
    Acked(Acked),
    /// It will never be acknowledged (the store fails the write).
    Failed(SendError),
    /// This attempt failed for a reason a later one may not meet (the client
    /// gave up after its own retries, or its queue was full): send it again.
    Again,
}

/// A write waiting for both confirmations (or, made with [`Settling::delivery_only`],
/// for the broker's alone).
#[derive(Default)]
pub struct Settling {
    parts: Mutex<Parts>,
}

#[derive(Default)]
struct Parts {
    local: Option<SyncResult>,
    delivered: Option<Delivered>,
    waker: Option<Waker>,
}

impl Parts {
    fn complete(&self) -> bool {
        self.local.is_some() && self.delivered.is_some()
    }
}

impl Settling {
    /// Waits for the group commit and the broker.
    pub fn new() -> Arc<Settling> {
        Arc::new(Settling::default())
    }

    /// Waits for the broker only (a send that has nothing to make durable here).
    pub fn delivery_only() -> Arc<Settling> {
        let settling = Settling::default();
        settling.lock().local = Some(Ok(()));
        Arc::new(settling)
    }

    fn lock(&self) -> MutexGuard<'_, Parts> {
        self.parts.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The sink's side: what became of the entry's send.
    pub fn delivered(&self, delivered: Delivered) {
        self.report(|parts| parts.delivered = Some(delivered));
    }

    /// One side's report: the writer is woken when it completes the pair.
    fn report(&self, set: impl FnOnce(&mut Parts)) {
        let mut parts = self.lock();
        set(&mut parts);
        let wake = if parts.complete() { parts.waker.take() } else { None };
        drop(parts);
        if let Some(w) = wake {
            w.wake();
        }
    }

    /// Resolves once both sides reported: the group commit's result, then the send's.
    pub fn settled(self: &Arc<Settling>) -> impl Future<Output = (SyncResult, Delivered)> + Send + 'static {
        Settled(self.clone())
    }
}

impl OnDurable for Settling {
    fn on_durable(&self, result: SyncResult) {
        self.report(|parts| parts.local = Some(result));
    }
}

/// A [`Settling`] whose delivery is still to be told: dropped untold (the send
/// panicked or was dropped), it tells [`SendError::Abandoned`].
pub struct Unanswered(Option<Arc<Settling>>);

impl Unanswered {
    pub fn new(settling: Arc<Settling>) -> Unanswered {
        Unanswered(Some(settling))
    }

    /// Tells the send's outcome.
    pub fn deliver(&mut self, delivered: Delivered) {
        if let Some(s) = self.0.take() {
            s.delivered(delivered);
        }
    }
}

impl Drop for Unanswered {
    fn drop(&mut self) {
        self.deliver(Delivered::Failed(SendError::Abandoned));
    }
}

struct Settled(Arc<Settling>);

impl Future for Settled {
    type Output = (SyncResult, Delivered);

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut parts = self.0.lock();
        if parts.complete() {
            let (local, delivered) = (parts.local.take(), parts.delivered.take());
            return Poll::Ready((local.expect("complete"), delivered.expect("complete")));
        }
        match &mut parts.waker {
            Some(w) if w.will_wake(cx.waker()) => {}
            slot => *slot = Some(cx.waker().clone()),
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acked(offset: i64) -> Delivered {
        Delivered::Acked(Acked { changelog_topic: "cl".into(), partition: 0, offset })
    }

    #[tokio::test]
    async fn the_writer_waits_for_both_sides_in_either_order() {
        for local_first in [true, false] {
            let s = Settling::new();
            let mut settled = Box::pin(s.settled());
            assert!(futures::poll!(settled.as_mut()).is_pending());
            if local_first {
                s.on_durable(Ok(()));
            } else {
                s.delivered(acked(7));
            }
            assert!(futures::poll!(settled.as_mut()).is_pending(), "one side is not enough");
            if local_first {
                s.delivered(acked(7));
            } else {
                s.on_durable(Ok(()));
            }
            let (local, delivered) = settled.await;
            assert!(local.is_ok());
            assert!(matches!(delivered, Delivered::Acked(Acked { offset: 7, .. })), "{delivered:?}");
        }
    }

    #[tokio::test]
    async fn a_send_dropped_before_it_answered_is_told_as_abandoned() {
        let s = Settling::delivery_only();
        let task = tokio::spawn({
            let mut unanswered = Unanswered::new(s.clone());
            async move {
                let _held = &mut unanswered;
                panic!("the send failed unexpectedly");
            }
        });
        assert!(task.await.unwrap_err().is_panic());
        let (_, delivered) = s.settled().await;
        assert!(matches!(delivered, Delivered::Failed(SendError::Abandoned)), "{delivered:?}");
    }

    #[tokio::test]
    async fn a_delivery_only_wait_needs_the_broker_alone_and_a_failure_is_reported() {
        let s = Settling::delivery_only();
        let waiting = tokio::spawn(s.settled());
        s.delivered(Delivered::Failed(SendError::Gone { changelog_topic: "cl".into(), partition: 3 }));
        let (local, delivered) = waiting.await.unwrap();
        assert!(local.is_ok());
        assert!(matches!(delivered, Delivered::Failed(SendError::Gone { partition: 3, .. })), "{delivered:?}");
    }
}
