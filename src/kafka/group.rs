//! The consumer group as the brokers describe it (DescribeGroups), for the
//! console: every member, where it runs and which partitions it holds. A client
//! of its own that never joins the group: asking costs the group nothing.

use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer as _};

use super::options;
use super::KafkaError;
use crate::config::KafkaConfig;
use crate::offsets::PartitionId;

/// One member of the group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// The member id the coordinator gave it.
    pub id: String,
    /// Its `client.id`.
    pub client_id: String,
    /// Where it connects from, as the broker sees it.
    pub host: String,
    /// The partitions assigned to it, in name order.
    pub partitions: Vec<PartitionId>,
}

/// The group's state (`Stable`, `PreparingRebalance`, `Empty`, …) and its members.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupView {
    pub state: String,
    pub members: Vec<Member>,
}

/// Describes the group `kafka.group_id`.
pub struct Group {
    client: BaseConsumer,
    group_id: String,
}

impl Group {
    pub fn new(kafka: &KafkaConfig) -> Result<Group, KafkaError> {
        let client = options::admin(kafka).create().map_err(KafkaError::Client)?;
        Ok(Group { client, group_id: kafka.group_id.clone() })
    }

    /// The group now, within `timeout` (blocking: run it off the runtime's workers).
    pub fn describe(&self, timeout: Duration) -> Result<GroupView, KafkaError> {
        let list = self.client.fetch_group_list(Some(&self.group_id), timeout).map_err(KafkaError::Client)?;
        let Some(group) = list.groups().iter().find(|g| g.name() == self.group_id) else {
            return Ok(GroupView { state: "unknown".into(), members: Vec::new() });
        };
        let members = group
            .members()
            .iter()
            .map(|m| Member {
                id: m.id().to_owned(),
                client_id: m.client_id().to_owned(),
                host: m.client_host().trim_start_matches('/').to_owned(),
                partitions: m.assignment().map(assigned).unwrap_or_default(),
            })
            .collect();
        Ok(GroupView { state: group.state().to_owned(), members })
    }
}

/// The partitions of a member's assignment in the consumer protocol's layout:
/// version (i16), then topics (i32 count) each a name (i16 length) and its
/// partitions (i32 count of i32), then user data, which is ignored. Anything that
/// does not parse gives what parsed so far.
fn assigned(bytes: &[u8]) -> Vec<PartitionId> {
    let mut r = Reader(bytes);
    let mut out = Vec::new();
    let parsed = (|| {
        r.i16()?;
        for _ in 0..r.i32()?.max(0) {
            let len = r.i16()?.max(0) as usize;
            let topic = String::from_utf8_lossy(r.take(len)?).into_owned();
            for _ in 0..r.i32()?.max(0) {
                out.push(PartitionId::new(topic.clone(), r.i32()?));
            }
        }
        Some(())
    })();
    let _ = parsed;
    out.sort();
    out
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }

    fn i16(&mut self) -> Option<i16> {
        Some(i16::from_be_bytes(self.take(2)?.try_into().ok()?))
    }

    fn i32(&mut self) -> Option<i32> {
        Some(i32::from_be_bytes(self.take(4)?.try_into().ok()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_assignment_in_the_consumer_protocol_layout_gives_its_partitions() {
        let mut b = vec![0, 1, 0, 0, 0, 1, 0, 2];
        b.extend_from_slice(b"ab");
        b.extend_from_slice(&[0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, 1, 0, 0, 0, 0]);
        assert_eq!(assigned(&b), vec![PartitionId::new("ab", 1), PartitionId::new("ab", 3)]);
        // Cut short: what parsed so far.
        assert_eq!(assigned(&b[..b.len() - 6]), vec![PartitionId::new("ab", 3)]);
        assert!(assigned(&[]).is_empty());
    }
}
