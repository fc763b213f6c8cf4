//! Assertions shared by the debezium and avro tests.

use super::*;

/// A topic named as Debezium's EventRouter routes `aggregatetype` by default.
pub fn outbox_topic(aggregatetype: &str) -> String {
    format!("outbox.event.{aggregatetype}")
}

pub fn ids(rows: &[OutboxRow]) -> Vec<String> {
    rows.iter().map(|r| r.id.clone()).collect()
}

/// Waits until the receiver answered every event of `rows` with 2xx; fails at once when
/// outboxd exits or `connector` (which feeds the topic) FAILED.
pub async fn wait_all_answered(
    od: &mut Outboxd,
    receiver: &Receiver,
    rows: &[OutboxRow],
    timeout: Duration,
    connect: &Connect,
    connector: &str,
) {
    let ids = ids(rows);
    // Connect is asked once a second, the receiver at every look.
    let mut next_look = Instant::now();
    od.wait_for(format!("the receiver to answer all {} events", ids.len()), timeout, async |_| {
        let n = receiver.count_answered_ok(&ids);
        if n == ids.len() {
            return Ok(());
        }
        if Instant::now() >= next_look {
            next_look = Instant::now() + Duration::from_secs(1);
            assert_connector_alive(connect, connector, &format!("the receiver had answered {n} of {}", ids.len()))
                .await;
        }
        let missing: Vec<&String> = ids.iter().filter(|id| !receiver.answered(id)).take(10).collect();
        Err(format!("{n} answered; not answered e.g.: {missing:?}"))
    })
    .await;
}

pub async fn assert_connector_alive(connect: &Connect, connector: &str, when: &str) {
    if let Ok(Some(status)) = connect.status(connector).await {
        if let Some(trace) = failure(&status) {
            panic!("connector {connector} FAILED while {when}: {}", shorten(&trace, 4000));
        }
    }
}

pub async fn wait_committed_to_end(od: &mut Outboxd, offsets: &OffsetReader, timeout: Duration) {
    od.wait_until(format!("outboxd's committed offsets to reach the end of {}", offsets.topic), timeout, || {
        offsets.reached_end()
    })
    .await;
}

/// Every event of `rows` reached the receiver exactly once, and nothing else did.
pub fn assert_each_called_once(receiver: &Receiver, rows: &[OutboxRow]) {
    let calls = receiver.calls();
    let mut per_id: HashMap<&str, usize> = HashMap::new();
    for c in &calls {
        *per_id.entry(c.event_id.as_deref().unwrap_or("<no Idempotency-Key>")).or_default() += 1;
    }
    let wrong: Vec<(&str, usize)> = rows
        .iter()
        .map(|r| (r.id.as_str(), per_id.get(r.id.as_str()).copied().unwrap_or(0)))
        .filter(|(_, n)| *n != 1)
        .collect();
    assert!(
        wrong.is_empty(),
        "each event must reach the receiver exactly once; {} did not, e.g. (event id, calls): {:?}",
        wrong.len(),
        &wrong[..wrong.len().min(20)]
    );
    let expected: HashSet<&str> = rows.iter().map(|r| r.id.as_str()).collect();
    let unexpected: Vec<&str> = per_id.keys().copied().filter(|id| !expected.contains(id)).collect();
    assert!(unexpected.is_empty(), "calls for events that were never committed: {unexpected:?}");
    assert_eq!(calls.len(), rows.len(), "one call per event");
}
