//! How long an event takes from its COMMIT to the receiver, measured and printed.

use super::*;

// ---------------------------------------------------------------- latency

/// End-to-end latency from the acknowledged PostgreSQL COMMIT to the start of the
/// receiver's HTTP call, over 200 single-row transactions at about 50 per second,
/// through the production connector. Printed, not asserted; split at the moment the
/// broker appended the message (the topic uses `LogAppendTime`): Debezium + Connect
/// before, Kafka + outboxd after. Debezium's `poll.interval.ms` (default 500 ms: how
/// long it sleeps when the WAL or its queue is empty) dominates the first part.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debezium_latency_is_reported() {
    const ROWS: usize = 200;
    const PAUSE: Duration = Duration::from_millis(20);
    let st = stack().await;
    let aggregatetype = unique_name("latency");
    let topic = outbox_topic(&aggregatetype);
    // The record timestamp is then the moment the broker appended the message.
    st.kafka.create_topic(&topic, 3, &[("message.timestamp.type", "LogAppendTime")]).await;
    let Scenario { receiver, mut od, offsets, .. } = st.running_outboxd(&topic).await;

    let mut db = st.pg.session();
    // Warm-up: the first event of a topic pays for metadata look-ups and connections.
    let warm = OutboxRow::new(&aggregatetype, "warm-up", "WarmUp", json!({"warm": true}));
    db.exec(&insert_sql(MAIN_TABLE, std::slice::from_ref(&warm))).await;
    wait_all_answered(&mut od, &receiver, std::slice::from_ref(&warm), HANDLED_TIMEOUT, &st.connect, MAIN_CONNECTOR)
        .await;

    let mut rows = Vec::with_capacity(ROWS);
    let mut committed: HashMap<String, SystemTime> = HashMap::new();
    let began = Instant::now();
    for i in 0..ROWS {
        let r = OutboxRow::new(&aggregatetype, &format!("acct-{}", i % 20), "Measured", json!({"i": i}));
        let at = db.exec(&insert_sql(MAIN_TABLE, std::slice::from_ref(&r))).await;
        committed.insert(r.id.clone(), at);
        rows.push(r);
        tokio::time::sleep(PAUSE).await;
    }
    let writing = began.elapsed();
    db.close().await;
    wait_all_answered(&mut od, &receiver, &rows, HANDLED_TIMEOUT, &st.connect, MAIN_CONNECTOR).await;
    wait_committed_to_end(&mut od, &offsets, HANDLED_TIMEOUT).await;
    od.stop();

    let kafka_ts: HashMap<String, i64> = st
        .kafka
        .read_topic(&topic, TOPIC_READ_TIMEOUT)
        .iter()
        .filter_map(|m| Some((m.header("id")?, m.timestamp_ms?)))
        .collect();
    let (mut total, mut to_kafka, mut from_kafka) = (Vec::new(), Vec::new(), Vec::new());
    for r in &rows {
        let call = &receiver.calls_for(&r.id)[0];
        let commit = committed[&r.id];
        total.push(ms_between(commit, call.started));
        if let Some(ts) = kafka_ts.get(&r.id) {
            let ts = SystemTime::UNIX_EPOCH + Duration::from_millis(*ts as u64);
            to_kafka.push(ms_between(commit, ts));
            from_kafka.push(ms_between(ts, call.started));
        }
    }
    eprintln!(
        "latency over {ROWS} single-row transactions written in {writing:.1?} ({:.0}/s):",
        ROWS as f64 / writing.as_secs_f64()
    );
    eprintln!("  commit → receiver call:         {}", describe_ms(total));
    eprintln!("  commit → appended to Kafka:     {}", describe_ms(to_kafka));
    eprintln!("  appended to Kafka → call:       {}", describe_ms(from_kafka));
    assert_each_called_once(&receiver, &rows.iter().chain([&warm]).cloned().collect::<Vec<_>>());

    delete_main_rows(&st.pg, &aggregatetype);
    st.assert_left_clean().await;
}
