//! One event's cost through the executor without Kafka: a store in a directory
//! (changelog off, fsync off, the group commit as shipped), a handler that answers at
//! once, events that are new. For the benchmark (`outboxd-bench event-cost`, whose
//! allocator counts what a run of [`EventCost::run`] allocates), not a test.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use super::executor::Executor;
use crate::config::Config;
use crate::event::{OutboxEvent, RawMessage};
use crate::handler::{Handler, HandlerError, Outcome};
use crate::store::{Store, StoreOptions};

/// The topic the events come on.
const TOPIC: &str = "orders";

/// Answers every event at once, allocating nothing of its own but the outcome's text
/// (a text of its own, as every shipped handler's: an empty one would allocate nothing,
/// and neither would any copy of it that outboxd made).
struct Answers;

#[async_trait::async_trait]
impl Handler for Answers {
    async fn handle(&self, _event: &OutboxEvent) -> Result<Outcome, HandlerError> {
        Ok(Outcome("answered".to_owned()))
    }
}

/// An executor over a store in `dir`, and the messages it is given.
pub struct EventCost {
    exec: Executor,
    next: i64,
}

impl EventCost {
    /// `on_uncertain`: the handler's policy (`retry` claims in memory, `verify` and
    /// `park` write the claim).
    pub fn new(dir: &Path, on_uncertain: &str) -> anyhow::Result<EventCost> {
        let toml = format!(
            "[kafka]\nbrokers = \"127.0.0.1:9\"\ngroup_id = \"g\"\n[store]\npath = {:?}\n\
             [store.changelog]\nenabled = false\n\
             [[handlers]]\ntopics = [\"{TOPIC}\"]\nkind = \"log\"\non_uncertain = {on_uncertain:?}\n",
            dir.join("store"),
        );
        let config = Config::parse(&toml, &|_| None)?;
        // As the service opens it, but for the fdatasync: the disk's time is not the CPU's.
        let opts = StoreOptions { fsync: false, ..StoreOptions::from(&config.store) };
        let store = Arc::new(Store::open(&config.store.path, &opts)?);
        let custom = HashMap::from([(TOPIC.to_owned(), Arc::new(Answers) as Arc<dyn Handler>)]);
        Ok(EventCost { exec: Executor::with_handlers(config, store, custom)?, next: 0 })
    }

    /// `n` new messages, as the consumer hands them over (made before a measurement).
    pub fn messages(&mut self, n: usize) -> Vec<RawMessage> {
        (0..n)
            .map(|_| {
                self.next += 1;
                let id = format!("00000000-0000-4000-8000-{:012x}", self.next);
                RawMessage {
                    topic: TOPIC.to_owned(),
                    partition: 0,
                    offset: self.next,
                    key: Some(format!("order-{}", self.next % 1000).into_bytes()),
                    value: Some(br#"{"orderId":"order-1","status":"placed","total":129.95}"#.to_vec()),
                    headers: vec![("id".to_owned(), Some(id.into_bytes()))],
                    timestamp_ms: None,
                }
            })
            .collect()
    }

    /// Runs each message until its event is durably final, `in_flight` at a time.
    pub async fn run(&self, messages: &[RawMessage], in_flight: usize) -> anyhow::Result<()> {
        use futures::StreamExt as _;
        let mut runs = futures::stream::iter(messages).map(|m| self.exec.execute(m)).buffer_unordered(in_flight);
        while let Some(done) = runs.next().await {
            done?;
        }
        Ok(())
    }
}
