//! Offsets: what a contender's group has committed, and where a topic ends.

use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};

use crate::bench::client;

pub(crate) struct GroupWatch {
    consumer: BaseConsumer,
    tpl: TopicPartitionList,
}

impl GroupWatch {
    pub(crate) fn new(brokers: &str, group: &str, topic: &str, partitions: i32) -> anyhow::Result<GroupWatch> {
        let consumer: BaseConsumer = client(brokers, Some(group)).create()?;
        let mut tpl = TopicPartitionList::new();
        for p in 0..partitions {
            tpl.add_partition(topic, p);
        }
        Ok(GroupWatch { consumer, tpl })
    }

    pub(crate) fn committed(&self) -> i64 {
        match self.consumer.committed_offsets(self.tpl.clone(), Duration::from_secs(5)) {
            Ok(t) => t
                .elements()
                .iter()
                .map(|e| match e.offset() {
                    Offset::Offset(o) => o,
                    _ => 0,
                })
                .sum(),
            Err(_) => 0,
        }
    }
}

pub(crate) fn end_offsets(brokers: &str, topic: &str, partitions: i32) -> anyhow::Result<i64> {
    let c: BaseConsumer = client(brokers, None).create()?;
    let mut sum = 0;
    for p in 0..partitions {
        sum += c.fetch_watermarks(topic, p, Duration::from_secs(10))?.1;
    }
    Ok(sum)
}
