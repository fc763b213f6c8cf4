//! A [`Source`] in memory, for the poll loop's tests: messages produced by the
//! test, partitions assigned and lost by it through the same tracker steps the
//! Kafka consumer takes ([`kafka::assigned`], [`kafka::revoked`]), and a record
//! of everything the loop asked of the consumer (pauses, resumes, stored offsets,
//! commits), in order.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

use crate::event::RawMessage;
use crate::kafka::{self, RecvError, Source, Tracker};
use crate::offsets::{PartitionId, PartitionName};

/// What the poll loop asked of the source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Act {
    Pause(Vec<PartitionId>),
    Resume(Vec<PartitionId>),
    /// `store_offset(partition, next)`.
    Stored(PartitionId, i64),
    Committed(Vec<(PartitionId, i64)>),
    Rejoin,
}

/// Partitions, their messages not yet delivered, and what was asked.
#[derive(Default)]
struct Log {
    /// Per assigned partition, the messages fetched and not yet delivered (a paused
    /// partition keeps them: librdkafka fetches them again on resume).
    queued: BTreeMap<PartitionId, VecDeque<RawMessage>>,
    paused: BTreeSet<PartitionId>,
    /// The next offset `produce` gives, per partition.
    ends: BTreeMap<PartitionId, i64>,
    /// The partition the last message came from: delivery goes round the partitions.
    last: Option<PartitionId>,
    acts: Vec<Act>,
}

pub struct MemorySource {
    tracker: Tracker,
    log: Mutex<Log>,
    /// A message was produced or a partition resumed.
    wake: Notify,
    restore_wakeup: Arc<Notify>,
}

impl MemorySource {
    pub fn new(tracker: Tracker) -> Arc<MemorySource> {
        Arc::new(MemorySource { tracker, log: Mutex::default(), wake: Notify::new(), restore_wakeup: Arc::default() })
    }

    fn log(&self) -> std::sync::MutexGuard<'_, Log> {
        self.log.lock().expect("memory source lock")
    }

    /// The group assigns `partitions` to this member.
    pub fn assign(&self, partitions: &[PartitionId]) {
        {
            let mut log = self.log();
            for p in partitions {
                log.queued.entry(p.clone()).or_default();
            }
        }
        kafka::assigned(&self.tracker, partitions, |ps| self.pause(ps), &self.restore_wakeup);
    }

    /// The group took `partitions` away without a revoke (a session timeout): what
    /// was fetched of them is dropped.
    pub fn lose(&self, partitions: &[PartitionId]) {
        kafka::revoked(&self.tracker, partitions, true, Duration::ZERO, |_| {
            unreachable!("nothing is committed for lost partitions")
        });
        let mut log = self.log();
        for p in partitions {
            log.queued.remove(p);
            log.paused.remove(p);
        }
    }

    /// A message with event id `id` and Kafka key `key` at the end of `partition`
    /// of topic `topic`; returns its offset.
    pub fn produce(&self, topic: &str, partition: i32, key: &str, id: &str) -> i64 {
        let p = PartitionId::new(topic, partition);
        let mut log = self.log();
        let end = log.ends.entry(p.clone()).or_default();
        let offset = *end;
        *end += 1;
        let msg = RawMessage {
            topic: topic.to_owned(),
            partition,
            offset,
            key: Some(key.as_bytes().to_vec()),
            value: Some(br#"{"n":1}"#.to_vec()),
            headers: vec![("id".to_owned(), Some(id.as_bytes().to_vec()))],
            ..RawMessage::default()
        };
        log.queued.get_mut(&p).expect("produce into an assigned partition").push_back(msg);
        drop(log);
        self.wake.notify_waiters();
        offset
    }

    /// Everything the poll loop asked, in order.
    pub fn acts(&self) -> Vec<Act> {
        self.log().acts.clone()
    }

    /// The last offset stored for `partition` (the next one to commit), if any.
    pub fn stored(&self, partition: &PartitionId) -> Option<i64> {
        self.log().acts.iter().rev().find_map(|a| match a {
            Act::Stored(p, next) if p == partition => Some(*next),
            _ => None,
        })
    }

    /// Whether `partition` is paused now.
    pub fn is_paused(&self, partition: &PartitionId) -> bool {
        self.log().paused.contains(partition)
    }

    /// Messages of `partition` fetched and not yet delivered.
    pub fn undelivered(&self, partition: &PartitionId) -> usize {
        self.log().queued.get(partition).map_or(0, VecDeque::len)
    }

    /// The next deliverable message, going round the partitions that are not paused.
    fn next(&self) -> Option<RawMessage> {
        let mut log = self.log();
        let ready: Vec<PartitionId> = log
            .queued
            .iter()
            .filter(|(p, q)| !q.is_empty() && !log.paused.contains(*p))
            .map(|(p, _)| p.clone())
            .collect();
        let after = log.last.clone();
        let p = ready.iter().find(|p| after.as_ref().is_some_and(|a| *p > a)).or(ready.first())?.clone();
        log.last = Some(p.clone());
        log.queued.get_mut(&p)?.pop_front()
    }
}

#[async_trait::async_trait]
impl Source for MemorySource {
    async fn recv(&self) -> Result<RawMessage, RecvError> {
        loop {
            let woken = self.wake.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            if let Some(msg) = self.next() {
                return Ok(msg);
            }
            woken.await;
        }
    }

    fn pause(&self, partitions: &[PartitionId]) {
        let mut log = self.log();
        log.paused.extend(partitions.iter().cloned());
        log.acts.push(Act::Pause(partitions.to_vec()));
    }

    fn resume(&self, partitions: &[PartitionId]) {
        {
            let mut log = self.log();
            for p in partitions {
                log.paused.remove(p);
            }
            log.acts.push(Act::Resume(partitions.to_vec()));
        }
        self.wake.notify_waiters();
    }

    fn rejoin(&self) {
        self.log().acts.push(Act::Rejoin);
    }

    fn store_offset(&self, partition: &dyn PartitionName, next: i64) {
        self.log().acts.push(Act::Stored(PartitionId::new(partition.topic(), partition.number()), next));
    }

    fn commit_now(&self, offsets: &[(PartitionId, i64)]) {
        self.log().acts.push(Act::Committed(offsets.to_vec()));
    }

    fn restore_wakeup(&self) -> Arc<Notify> {
        self.restore_wakeup.clone()
    }

    async fn leave(&self, _within: std::time::Duration) {}
}
