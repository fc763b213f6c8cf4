//! Slow receiver: events per second when every call takes a fixed time (`SLOW_RECEIVER_MS`,
//! and the `--slow-latencies` for outboxd, Camel and naive), by `max_in_flight` and by how
//! many keys the events are spread over.

use std::time::{Duration, Instant};

use anyhow::bail;

use crate::bench::{Bench, Cfg, Contender, Hk};
use crate::scenarios::QUIET_LOG;
use crate::watch::end_offsets;
use crate::PARTITIONS;

pub(crate) async fn slow_run(
    b: &Bench,
    who: Contender,
    mif: usize,
    topic: &str,
    label: &str,
    latency_ms: u64,
    rep: usize,
) -> anyhow::Result<f64> {
    let name = format!("slow-{}-{mif}-{label}-{latency_ms}ms-{rep}", who.name());
    let group = format!("bench-{}-{name}", b.run_id);
    let (cfg, admin) = b.write_config(&Cfg {
        name: name.clone(),
        group: group.clone(),
        topics: vec![topic.to_owned()],
        handler: Hk::Http,
        fsync: who.fsync(),
        max_in_flight: mif,
        commit_window: who.window(),
        retention: "7d",
        gc_interval: "10m",
        drain_timeout: "2s",
        store_extra: String::new(),
        kafka_extra: Vec::new(),
        handler_extra: String::new(),
    })?;
    let _ = admin;
    b.recv.reset(latency_ms);
    let mut child = match who.is_camel() {
        true => {
            let ids = end_offsets(&b.args.brokers, topic, PARTITIONS)? as u64;
            crate::camel::spawn(b, who, &name, &group, &[topic.to_owned()], ids, None).await?
        }
        false => b.spawn(who, &cfg, "unused", QUIET_LOG)?,
    };
    child.wait_assigned().await?;
    let t0 = Instant::now();
    while b.recv.calls() == 0 {
        child.check_alive()?;
        if t0.elapsed() > Duration::from_secs(60) {
            bail!("{}: no call reached the receiver", who.name());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (c1, t1) = (b.recv.calls(), Instant::now());
    tokio::time::sleep(Duration::from_secs(b.sizes.slow_secs)).await;
    let (c2, t2) = (b.recv.calls(), Instant::now());
    child.check_alive()?;
    child.stop(Duration::from_secs(30)).await?;
    b.recv.reset(0);
    let eps = (c2 - c1) as f64 / (t2 - t1).as_secs_f64();
    eprintln!(
        "bench: slow receiver {latency_ms:>2} ms {:<16} max_in_flight {mif:>3} {label:<9} run {rep}: {eps:>7.0} events/s",
        who.name()
    );
    Ok(eps)
}
