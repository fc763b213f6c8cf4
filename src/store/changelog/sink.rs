//! Where changelog entries go: the [`Sink`] (the Kafka side implements it).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use super::entry::{Acked, Entry};
use super::settling::{self, Delivered, Settling};
use crate::store::error::SendError;

/// What [`Sink::send`] returns: where the entry went, or why it never will.
pub type SendFuture = Pin<Box<dyn Future<Output = Result<Acked, SendError>> + Send>>;

/// Writes changelog entries. Answers once the broker acknowledged the entry, or
/// with the reason it never will (then the store fails: no offset may move).
pub trait Sink: Send + Sync {
    /// Sends `entry` to the changelog partition of its source partition.
    fn send(&self, entry: Entry) -> SendFuture;

    /// Sends `entry` once and tells `settling` what became of it, without a
    /// future of its own (a final record's path: see [`settling`]). By default
    /// through [`Sink::send`] on a task of the runtime.
    fn send_settling(&self, entry: Entry, settling: Arc<Settling>) {
        let sent = self.send(entry);
        // However the task ends (a panic in the send, the runtime dropping it), the
        // writer hears of it: a send that never answers would hold its event for ever.
        let mut unanswered = settling::Unanswered::new(settling);
        tokio::spawn(async move {
            unanswered.deliver(match sent.await {
                Ok(acked) => Delivered::Acked(acked),
                Err(e) => Delivered::Failed(e),
            })
        });
    }

    /// Sends `entry` again after an attempt of [`Sink::send_settling`] came back
    /// [`Delivered::Again`]. By default [`Sink::send`].
    fn send_again(&self, entry: Entry) -> SendFuture {
        self.send(entry)
    }
}

