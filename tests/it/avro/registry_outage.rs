//! The schema registry stops mid-stream and comes back.

use super::*;

/// The registry stops mid-stream (`scripts/stack down registry`, by its PID). Connect
/// keeps writing (its converter cached the schema id when it registered the schema). An
/// outboxd that already fetched the schema goes on handling events, also after a restart
/// (its schema cache is on disk under the store). A FRESH outboxd (new store, new group:
/// nothing cached) must not guess: its events are not handled and its committed offsets
/// do not move while the registry is down, and it logs that it waits for the registry.
/// Once the registry is back (same schema ids: they live in its database), every event
/// reaches the fresh outboxd's receiver exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registry_outage_makes_events_wait_then_flow() {
    /// How long the fresh outboxd is watched doing nothing while the registry is down.
    const HOLD: Duration = Duration::from_secs(6);
    /// Bound for the fresh outboxd to say that it waits for the registry.
    const WAIT_LOG_TIMEOUT: Duration = Duration::from_secs(60);
    let st = stack().await;
    let mut scratch = Scratch::new(&st.pg, &st.connect);
    let (table, publication) = scratch.create_outbox_table("avrodown");
    let aggregatetype = unique_name("avro-down");
    let topic = outbox_topic(&aggregatetype);
    st.kafka.create_topic(&topic, 3, &[]).await;
    let name = scratch.connector_name("avrodown");
    let config = st.avro_connector(&name, (&table, &publication), &scratch.sql_name("slot"), &topic, false, &[]);
    scratch.start_connector(&name, &config, CONNECTOR_TIMEOUT).await;

    // A warm outboxd fetches the schema while the registry is up.
    let Scenario { receiver: warm_receiver, od: mut warm, offsets: warm_offsets, .. } =
        st.running_outboxd(&topic, "").await;
    let mut rows = shape_rows(&aggregatetype, "BeforeOutage");
    write_rows(&st.pg, &table, &rows).await;
    wait_all_answered(&mut warm, &warm_receiver, &rows, HANDLED_TIMEOUT, &st.connect, &name).await;
    wait_committed_to_end(&mut warm, &warm_offsets, HANDLED_TIMEOUT).await;

    // Registry down. Connect still writes, and the warm outboxd still handles.
    let mut outage = RegistryOutage::default();
    let stopped_in = outage.stop().await;
    assert!(st.registry.schema_by_id(1).await.is_err(), "the registry still answers after `down registry`");
    let during: Vec<OutboxRow> = (0..8)
        .map(|i| {
            OutboxRow::new(&aggregatetype, &format!("agg-{}", i % 3), "DuringOutage", json!({"i": i, "down": true}))
        })
        .collect();
    write_rows(&st.pg, &table, &during).await;
    rows.extend(during.iter().cloned());
    wait_messages(&warm_offsets, rows.len() as i64, &st.connect, &name, HANDLED_TIMEOUT).await;
    wait_all_answered(&mut warm, &warm_receiver, &rows, HANDLED_TIMEOUT, &st.connect, &name).await;
    // ... also after a restart: the schema comes from its store's disk cache.
    warm.stop();
    let after_restart: Vec<OutboxRow> =
        (0..4).map(|i| OutboxRow::new(&aggregatetype, &format!("agg-{i}"), "AfterRestart", json!({"i": i}))).collect();
    write_rows(&st.pg, &table, &after_restart).await;
    rows.extend(after_restart.iter().cloned());
    wait_messages(&warm_offsets, rows.len() as i64, &st.connect, &name, HANDLED_TIMEOUT).await;
    warm.start();
    warm.wait_for_assignment().await;
    wait_all_answered(&mut warm, &warm_receiver, &rows, HANDLED_TIMEOUT, &st.connect, &name).await;
    wait_committed_to_end(&mut warm, &warm_offsets, HANDLED_TIMEOUT).await;
    warm.stop();
    assert_each_called_once(&warm_receiver, &rows);

    // A fresh outboxd: nothing cached, so nothing can be decoded until the registry is back.
    let Scenario { receiver, mut od, offsets, .. } = st.running_outboxd(&topic, "").await;
    // A line about the registry that says it is waiting (not, say, the URL at start-up).
    let log_lines = |od: &Outboxd| -> Vec<String> {
        od.log()
            .lines()
            .filter(|l| {
                let l = l.to_ascii_lowercase();
                l.contains("registry")
                    && ["wait", "retry", "unavailable", "unreachable", "error", "fail"].iter().any(|w| l.contains(w))
            })
            .map(str::to_string)
            .collect()
    };
    od.wait_for("the fresh outboxd to log that it waits for the schema registry", WAIT_LOG_TIMEOUT, async |od| {
        if log_lines(od).is_empty() {
            Err("nothing logged")
        } else {
            Ok(())
        }
    })
    .await;
    let committed_at_start = offsets.committed();
    let hold_until = Instant::now() + HOLD;
    while Instant::now() < hold_until {
        od.assert_alive();
        assert!(
            receiver.calls().is_empty(),
            "events were handled while the registry was down (the fresh outboxd has no schema): {:?}",
            receiver.calls().first()
        );
        assert_eq!(offsets.committed(), committed_at_start, "committed offsets moved while the registry was down");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let waiting = log_lines(&od);
    eprintln!(
        "registry down (stopped in {stopped_in:.1?}); the fresh outboxd held for {HOLD:?} with nothing handled, \
         offsets {}; it logged {} line(s) about the registry, e.g. {}",
        offsets.describe(),
        waiting.len(),
        shorten(waiting.first().map_or("", String::as_str), 400)
    );

    // Registry back: everything flows, once.
    let back_at = Instant::now();
    let started_in = outage.start();
    wait_all_answered(&mut od, &receiver, &rows, HANDLED_TIMEOUT, &st.connect, &name).await;
    let flowed_after = back_at.elapsed();
    wait_committed_to_end(&mut od, &offsets, HANDLED_TIMEOUT).await;
    tokio::time::sleep(SETTLE).await;
    od.stop();
    eprintln!(
        "registry back up in {started_in:.1?}; all {} events handled {flowed_after:.1?} after the restart began",
        rows.len()
    );
    assert_each_called_once(&receiver, &rows);
    assert_calls_match_rows(&receiver, &rows);
    let stats = od.store_stats();
    assert_eq!(stats["done"].as_u64(), Some(rows.len() as u64), "{stats}");
    assert_eq!(stats["dead"].as_u64(), Some(0), "nothing may be dead-lettered for a registry outage: {stats}");

    scratch.cleanup().await.expect("clean-up");
    st.assert_left_clean().await;
}
