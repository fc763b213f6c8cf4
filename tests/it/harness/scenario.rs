//! One test's world in one line: a fresh topic, a receiver, outboxd configured for
//! them, the group's committed offsets and a producer.
//!
//! ```ignore
//! let Scenario { topic, receiver, mut od, offsets, producer, .. } = Scenario::start("redeliver", 3).await;
//! // or, to change outboxd's config before it starts:
//! let mut s = Scenario::new("uncommitted", 1).await;
//! s.od.config.handler_timeout = "120s".into();
//! s.run().await;
//! ```
//!
//! Destructuring a `Scenario` the call just returned drops the fields the pattern
//! leaves out: bind `receiver` (as `_receiver` when the test does not look at it) for
//! as long as outboxd runs, or its calls find no server.

use super::{unique_name, Kafka, OffsetReader, Outboxd, Producer, Receiver};

/// One test's world: a fresh topic of `partitions` partitions, a receiver, outboxd
/// configured for them (not started), the group's committed offsets and a producer.
pub struct Scenario {
    pub kafka: Kafka,
    /// The source topic; outboxd's one handler reads it and calls `receiver`.
    pub topic: String,
    pub receiver: Receiver,
    pub od: Outboxd,
    /// What `od`'s group, as the scenario made it, has committed for `topic`'s
    /// partitions as they were then: a test that changes `od.config.group_id` or adds
    /// partitions makes a reader of its own ([`Kafka::offsets`]).
    pub offsets: OffsetReader,
    pub producer: Producer,
}

impl Scenario {
    /// Everything but outboxd running, on a new topic named after `name`: change
    /// `od.config`, then call [`Scenario::run`].
    pub async fn new(name: &str, partitions: i32) -> Scenario {
        let kafka = Kafka::connect();
        let topic = kafka.create_topic(&unique_name(name), partitions, &[]).await;
        Scenario::on(kafka, topic)
    }

    /// [`Scenario::new`], then [`Scenario::run`]: outboxd started and its partitions
    /// assigned (and restored).
    pub async fn start(name: &str, partitions: i32) -> Scenario {
        let mut s = Scenario::new(name, partitions).await;
        s.run().await;
        s
    }

    /// Like [`Scenario::new`], on `topic` of `kafka`, which the test created: with topic
    /// configs, under a name someone else dictates (Debezium's
    /// `outbox.event.<aggregatetype>`), or on a private broker. Several scenarios may
    /// share a topic: each has its own receiver, group and store.
    pub fn on(kafka: Kafka, topic: String) -> Scenario {
        let receiver = Receiver::start();
        let od = Outboxd::new(&kafka, &[&topic], &receiver);
        let offsets = kafka.offsets(&od.config.group_id, &topic);
        let producer = kafka.producer();
        Scenario { kafka, topic, receiver, od, offsets, producer }
    }

    /// Starts outboxd and waits for its assignment.
    pub async fn run(&mut self) {
        self.od.start();
        self.od.wait_for_assignment().await;
    }
}
