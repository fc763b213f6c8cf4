//! Rows become side effects exactly once: as an application writes them, when Kafka
//! Connect is killed mid-stream, and when a snapshot emits them again.

use super::*;

/// Rows written by an application (with its state change in the same transaction,
/// several per transaction, insert-then-delete, rolled back) through the production
/// connector (`debezium/connector.json`, String converters) each become exactly one
/// HTTP call with the row's payload, type, aggregate id and id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debezium_outbox_rows_become_side_effects() {
    let st = stack().await;
    let aggregatetype = unique_name("rows");
    let topic = outbox_topic(&aggregatetype);
    st.kafka.create_topic(&topic, 3, &[]).await;
    let Scenario { receiver, mut od, offsets, .. } = st.running_outboxd(&topic).await;

    let mut db = st.pg.session();
    let mut rows = Vec::new();
    let row = |aggregateid: &str, event_type: &str, payload: Value| {
        OutboxRow::new(&aggregatetype, aggregateid, event_type, payload)
    };
    // An order's state change and its event in one transaction (debezium/outbox.sql).
    for i in 0..4 {
        let order = format!("{aggregatetype}-order-{i}");
        let placed =
            row(&order, "OrderPlaced", json!({"orderId": order, "total": 10.5 * (i + 1) as f64, "currency": "EUR"}));
        db.exec(&format!(
            "BEGIN; INSERT INTO public.orders (id, status, updated_at) VALUES ({}, 'placed', now()); {} COMMIT;",
            lit(&order),
            insert_sql(MAIN_TABLE, std::slice::from_ref(&placed))
        ))
        .await;
        let paid = row(&order, "OrderPaid", json!({"orderId": order, "paid": true}));
        db.exec(&format!(
            "BEGIN; UPDATE public.orders SET status = 'paid', updated_at = now() WHERE id = {}; {} COMMIT;",
            lit(&order),
            insert_sql(MAIN_TABLE, std::slice::from_ref(&paid))
        ))
        .await;
        rows.extend([placed, paid]);
    }
    // Several events of two aggregates in one transaction.
    let batch: Vec<OutboxRow> =
        (0..6).map(|k| row(&format!("{aggregatetype}-cart-{}", k % 2), "CartChanged", json!({"step": k}))).collect();
    db.exec(&format!("BEGIN; {} COMMIT;", insert_sql(MAIN_TABLE, &batch))).await;
    rows.extend(batch);
    // Insert-then-delete in one transaction: the table stays empty, the event is sent.
    let transient = row(&format!("{aggregatetype}-user-1"), "MailRequested", json!({"to": "a@example.com"}));
    db.exec(&format!(
        "BEGIN; {} DELETE FROM {MAIN_TABLE} WHERE id = {}; COMMIT;",
        insert_sql(MAIN_TABLE, std::slice::from_ref(&transient)),
        lit(&transient.id)
    ))
    .await;
    rows.push(transient);
    // Payloads of many shapes, one autocommitted statement each.
    for (i, payload) in payload_shapes(false).into_iter().enumerate() {
        let r = row(&format!("{aggregatetype}-shape-{i}"), "ShapeTested", payload);
        db.exec(&insert_sql(MAIN_TABLE, std::slice::from_ref(&r))).await;
        rows.push(r);
    }
    // An aggregate id that is not URL-safe: one percent-encoded path segment, the
    // header verbatim.
    let odd = row("customer 42/eu?x=1#y%20", "CustomerMoved", json!({"to": "eu"}));
    db.exec(&insert_sql(MAIN_TABLE, std::slice::from_ref(&odd))).await;
    rows.push(odd);
    // A rolled-back transaction never becomes an event.
    let rolled_back = row(&format!("{aggregatetype}-order-x"), "OrderPlaced", json!({"never": true}));
    db.exec(&format!("BEGIN; {} ROLLBACK;", insert_sql(MAIN_TABLE, std::slice::from_ref(&rolled_back)))).await;
    db.close().await;

    wait_all_answered(&mut od, &receiver, &rows, HANDLED_TIMEOUT, &st.connect, MAIN_CONNECTOR).await;
    wait_committed_to_end(&mut od, &offsets, HANDLED_TIMEOUT).await;
    tokio::time::sleep(SETTLE).await;
    od.stop();

    assert_each_called_once(&receiver, &rows);
    assert!(receiver.calls_for(&rolled_back.id).is_empty(), "a rolled-back event was executed");
    assert_calls_match_rows(&receiver, &rows);
    // Events of one aggregate are handled in commit order.
    for i in 0..4 {
        let order = format!("{aggregatetype}-order-{i}");
        let seqs: Vec<(usize, String)> = receiver
            .calls()
            .iter()
            .filter(|c| c.header("Outbox-Aggregate-Id") == Some(order.as_str()))
            .map(|c| (c.seq, c.header("Outbox-Event-Type").unwrap_or_default().to_string()))
            .collect();
        let types: Vec<&str> = seqs.iter().map(|(_, t)| t.as_str()).collect();
        assert_eq!(types, ["OrderPlaced", "OrderPaid"], "order of the events of {order}");
    }
    for r in &rows {
        let rec = od.store_get(&r.id);
        assert_eq!(rec.state, "done", "{rec:?}");
        assert_eq!(rec.attempts, 1, "{rec:?}");
        assert_eq!(rec.topic, topic, "{rec:?}");
        assert_eq!(rec.key.as_deref(), Some(r.aggregateid.as_str()), "{rec:?}");
        assert_eq!(rec.event_type.as_deref(), Some(r.event_type.as_str()), "{rec:?}");
    }
    let paid = st.pg.query(&format!(
        "SELECT count(*) FROM public.orders WHERE id LIKE {} AND status = 'paid'",
        lit(&format!("{aggregatetype}-order-%"))
    ));
    assert_eq!(paid.trim(), "4", "the orders' state changes committed with their events");
    let messages = st.kafka.read_topic(&topic, TOPIC_READ_TIMEOUT);
    eprintln!(
        "rows committed: {}, messages on {topic}: {}, receiver calls: {}",
        rows.len(),
        messages.len(),
        receiver.calls().len()
    );
    delete_main_rows(&st.pg, &aggregatetype);
    st.assert_left_clean().await;
}

/// Kafka Connect is SIGKILLed while 1,000+ rows are being written; after its restart
/// Debezium publishes again what it had published since its last offset flush (same
/// `id` header, new offsets). Each event still reaches the receiver exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debezium_crash_replays_are_suppressed() {
    const ROWS_PER_CYCLE: usize = 1200;
    const PER_TX: usize = 20;
    const PAUSE: Duration = Duration::from_millis(40);
    const KEYS: usize = 50;
    /// Kill cycles until Debezium re-sends something (almost always the first).
    const MAX_CYCLES: usize = 3;

    let st = stack().await;
    let aggregatetype = unique_name("crash");
    let topic = outbox_topic(&aggregatetype);
    st.kafka.create_topic(&topic, 3, &[]).await;
    let Scenario { receiver, mut od, offsets, .. } = st.running_outboxd(&topic).await;

    let mut crash = ConnectCrash::default();
    let mut all_rows: Vec<OutboxRow> = Vec::new();
    let mut resent_total = 0;
    for cycle in 1..=MAX_CYCLES {
        let rows: Vec<OutboxRow> = (0..ROWS_PER_CYCLE)
            .map(|i| {
                OutboxRow::new(
                    &aggregatetype,
                    &format!("acct-{}", i % KEYS),
                    "BalanceChanged",
                    json!({"cycle": cycle, "i": i, "delta": i as i64 - 600}),
                )
            })
            .collect();
        let before = st.messages_on(&offsets);
        let progress = Progress::default();
        let writer = tokio::spawn(write_over_time(
            st.pg.clone(),
            MAIN_TABLE.to_string(),
            rows.clone(),
            PER_TX,
            PAUSE,
            progress.clone(),
        ));
        // Kill while rows flow, once Debezium has published some of this cycle's.
        wait_until(format!("cycle {cycle}: a third of the rows written and some published"), HANDLED_TIMEOUT, || {
            progress.load(Ordering::SeqCst) >= ROWS_PER_CYCLE / 3 && st.messages_on(&offsets) > before
        })
        .await;
        let published = st.messages_on(&offsets) - before;
        crash.kill();
        let written_at_kill = progress.load(Ordering::SeqCst);
        join(writer).await;
        let restart = crash.start();
        wait_all_answered(&mut od, &receiver, &rows, HANDLED_TIMEOUT, &st.connect, MAIN_CONNECTOR).await;
        wait_committed_to_end(&mut od, &offsets, HANDLED_TIMEOUT).await;
        tokio::time::sleep(SETTLE).await;
        let messages = st.messages_on(&offsets) - before;
        let resent = messages - rows.len() as i64;
        eprintln!(
            "cycle {cycle}: {} rows; SIGKILL of Connect after {written_at_kill} rows were committed and {published} \
             published; Connect back with the connector RUNNING in {restart:.1?}; {messages} messages, \
             {resent} re-sent",
            rows.len()
        );
        assert!(resent >= 0, "fewer messages ({messages}) than rows ({}) yet all were handled?", rows.len());
        all_rows.extend(rows);
        resent_total += resent;
        if resent > 0 {
            break;
        }
    }
    od.assert_alive();
    od.stop();

    let messages = st.kafka.read_topic(&topic, TOPIC_READ_TIMEOUT);
    let per_id = messages_per_id(&messages);
    let resent_ids = per_id.values().filter(|n| **n > 1).count();
    let duplicates = messages.len() as i64 - all_rows.len() as i64;
    let calls = receiver.calls().len();
    eprintln!(
        "rows written: {}, messages on the topic: {}, duplicates: {duplicates} ({resent_ids} events sent more \
         than once), receiver calls: {calls}",
        all_rows.len(),
        messages.len()
    );
    assert!(
        resent_total > 0 && duplicates > 0,
        "in {MAX_CYCLES} kill cycles Debezium never re-sent an event: the test could not show the suppression"
    );
    for r in &all_rows {
        assert!(per_id.get(&r.id).is_some_and(|n| *n >= 1), "event {} never reached the topic", r.id);
    }
    assert_eq!(per_id.len(), all_rows.len(), "messages with ids that were never written");
    assert_each_called_once(&receiver, &all_rows);
    assert_calls_match_rows(&receiver, &all_rows[..50]);

    let stats = od.store_stats();
    eprintln!("outboxd store stats: {stats}");
    assert_eq!(stats["done"].as_u64(), Some(all_rows.len() as u64), "{stats}");
    assert_eq!(stats["claimed"].as_u64(), Some(0), "{stats}");
    assert_eq!(stats["dead"].as_u64(), Some(0), "{stats}");
    assert_eq!(
        stats["duplicates_suppressed"].as_u64(),
        Some(duplicates as u64),
        "every re-sent message should be counted as a suppressed duplicate: {stats}"
    );
    let resent_row = all_rows.iter().find(|r| per_id[&r.id] > 1).expect("a re-sent event");
    let rec = od.store_get(&resent_row.id);
    assert_eq!(rec.state, "done", "{rec:?}");

    delete_main_rows(&st.pg, &aggregatetype);
    st.assert_left_clean().await;
}

/// Rows that exist before a connector with `snapshot.mode=initial` starts are
/// snapshotted and handled. A new connector (no offsets, new slot: what re-registering
/// after lost offsets does) snapshots them again; the re-emitted events reach the
/// topic again and are suppressed, and streaming goes on after the snapshot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_reemission_is_suppressed() {
    const EXISTING: usize = 25;
    const LATER: usize = 5;
    let st = stack().await;
    let mut scratch = Scratch::new(&st.pg, &st.connect);
    let (table, publication) = scratch.create_outbox_table("snap");
    let aggregatetype = unique_name("snapshot");
    let topic = outbox_topic(&aggregatetype);
    st.kafka.create_topic(&topic, 3, &[]).await;
    let qualified = format!("public.{table}");
    let rows: Vec<OutboxRow> = (0..EXISTING)
        .map(|i| {
            OutboxRow::new(&aggregatetype, &format!("item-{}", i % 7), "ItemStocked", json!({"i": i, "qty": i * 3}))
        })
        .collect();
    st.pg.query(&insert_sql(&qualified, &rows));

    let Scenario { receiver, mut od, offsets, .. } = st.running_outboxd(&topic).await;

    let config = |name: &str, slot: &str| {
        connector_config(&st.pg, name, &table, &publication, slot, &[("snapshot.mode", "initial")])
    };
    let first = scratch.connector_name("snap1");
    scratch.start_connector(&first, &config(&first, &scratch.sql_name("slot1")), CONNECTOR_TIMEOUT).await;
    wait_all_answered(&mut od, &receiver, &rows, HANDLED_TIMEOUT, &st.connect, &first).await;
    wait_committed_to_end(&mut od, &offsets, HANDLED_TIMEOUT).await;
    assert_eq!(st.messages_on(&offsets), EXISTING as i64, "the first snapshot emits each row once");

    // Snapshot again.
    scratch.remove_connector(&first).await.expect("remove the first connector and its slot");
    let second = scratch.connector_name("snap2");
    scratch.start_connector(&second, &config(&second, &scratch.sql_name("slot2")), CONNECTOR_TIMEOUT).await;
    wait_until("the second snapshot to re-emit every row", HANDLED_TIMEOUT, || {
        st.messages_on(&offsets) >= 2 * EXISTING as i64
    })
    .await;
    // Streaming after the snapshot.
    let later: Vec<OutboxRow> = (0..LATER)
        .map(|i| OutboxRow::new(&aggregatetype, &format!("item-{i}"), "ItemSold", json!({"i": i, "sold": true})))
        .collect();
    st.pg.query(&insert_sql(&qualified, &later));
    let all: Vec<OutboxRow> = rows.iter().chain(&later).cloned().collect();
    wait_all_answered(&mut od, &receiver, &all, HANDLED_TIMEOUT, &st.connect, &second).await;
    wait_committed_to_end(&mut od, &offsets, HANDLED_TIMEOUT).await;
    tokio::time::sleep(SETTLE).await;
    od.stop();

    let messages = st.kafka.read_topic(&topic, TOPIC_READ_TIMEOUT);
    let per_id = messages_per_id(&messages);
    eprintln!(
        "rows: {EXISTING} before the connectors + {LATER} later; messages on the topic: {}; receiver calls: {}",
        messages.len(),
        receiver.calls().len()
    );
    for r in &rows {
        assert_eq!(per_id.get(&r.id), Some(&2), "snapshotted row {} should be on the topic twice", r.id);
    }
    for r in &later {
        assert_eq!(per_id.get(&r.id), Some(&1), "streamed row {} should be on the topic once", r.id);
    }
    assert_eq!(messages.len(), 2 * EXISTING + LATER);
    assert_each_called_once(&receiver, &all);
    assert_calls_match_rows(&receiver, &all);
    for r in &rows {
        let rec = od.store_get(&r.id);
        assert_eq!(rec.state, "done", "re-emitted by the snapshot: {rec:?}");
    }
    for r in &later {
        let rec = od.store_get(&r.id);
        assert_eq!(rec.state, "done", "{rec:?}");
    }
    let stats = od.store_stats();
    assert_eq!(stats["duplicates_suppressed"].as_u64(), Some(EXISTING as u64), "{stats}");

    scratch.cleanup().await.expect("clean-up");
    st.assert_left_clean().await;
}
