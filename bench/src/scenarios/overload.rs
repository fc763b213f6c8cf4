//! Overloaded receiver: a backlog drained into a receiver that slows down with
//! the calls it holds and answers 503 past a knee ([`MODEL`]), by outboxd with a
//! fixed in-flight limit and with adaptive concurrency (`[handlers.concurrency]`).
//! Measured at the receiver: events/s from the first call to the last event's
//! first 2xx, latency from produce time, 503s, calls per event.

use std::time::{Duration, Instant};

use anyhow::bail;

use crate::bench::{Bench, Cfg, Contender, Hk};
use crate::procs::{metric_series, metrics_text};
use crate::produce::preload;
use crate::receiver::Overload;
use crate::scenarios::QUIET_LOG;
use crate::stats::pct;
use crate::watch::GroupWatch;
use crate::PARTITIONS;

/// base 2 ms + 1 ms per call in flight, 503 past 32 in flight: a receiver that
/// serves about 1,000 calls/s at most (each call in flight adds 1 ms: work
/// serialized on one resource, e.g. a small database pool) and sheds load past
/// 32 calls, a common worker-pool size. At the knee it completes 32 / 34 ms =
/// 941 calls/s, 94% of what it can do; fewer calls in flight lose little
/// (16: 889/s, 8: 800/s) and more only add 503s. 941/s is well under outboxd's
/// own HTTP drain rate here (several thousand events/s), so the receiver is what
/// limits, and the default limit of 256 in flight overloads it 8 times over.
pub(crate) const MODEL: Overload =
    Overload { base: Duration::from_millis(2), per_call: Duration::from_millis(1), knee: 32 };

/// Events spread over this many keys: with 256 in flight about 226 distinct keys
/// are in flight at once, so per-key order does not hold concurrency under the knee.
pub(crate) const OVERLOAD_KEYS: u64 = 1_000;

/// `store.max_in_flight` (its default) and `[handlers.concurrency] max` of both contenders.
pub(crate) const MAX_IN_FLIGHT: usize = 256;

/// `[handlers.retry] max_attempts`: with the shipped 5, an event refused five
/// times in a row is dead, and 256 in flight against a knee of 32 make such runs
/// likely for some of thousands of events. With the shipped backoff (200 ms
/// doubling to 10 s, full jitter) the 49 waits of 50 attempts add up to 7.4 min at
/// most (half that on average), inside the shipped `max_elapsed` of 20 min, and
/// even a 90% chance of 503 per attempt
/// leaves 0.9^50 = 0.5% per event; the backoff lowers the attempt rate until most
/// attempts find a free slot, so far fewer are needed (attempts that open the
/// circuit, or fail while it is open, are not charged at all; measured: 1.3 to
/// 1.45 calls per event). The scenario fails if any event ends dead.
pub(crate) const MAX_ATTEMPTS: u32 = 50;

/// How outboxd limits the calls in flight to the receiver, and whether its
/// circuit breaker is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Limit {
    /// `[handlers.concurrency] adaptive`; None = no such table (as shipped).
    pub(crate) adaptive: Option<bool>,
    /// `[handlers.circuit] enabled`; true is the shipped default and writes no table.
    pub(crate) circuit: bool,
}

const fn limit(adaptive: Option<bool>, circuit: bool) -> Limit {
    Limit { adaptive, circuit }
}

/// Every contender, in report order.
pub(crate) const LIMITS: [Limit; 6] = [
    limit(Some(false), true),
    limit(Some(true), true),
    limit(Some(false), false),
    limit(Some(true), false),
    limit(None, true),
    limit(None, false),
];

impl Limit {
    pub(crate) fn name(self) -> &'static str {
        match (self.adaptive, self.circuit) {
            (Some(false), true) => "outboxd-fixed",
            (Some(true), true) => "outboxd-adaptive",
            (Some(false), false) => "outboxd-fixed-nocircuit",
            (Some(true), false) => "outboxd-adaptive-nocircuit",
            (None, true) => "outboxd",
            (None, false) => "outboxd-nocircuit",
        }
    }

    /// TOML appended to the handler entry.
    fn handler_extra(self) -> String {
        let mut t = format!("[handlers.retry]\nmax_attempts = {MAX_ATTEMPTS}\n");
        if let Some(adaptive) = self.adaptive {
            t.push_str(&format!("[handlers.concurrency]\nadaptive = {adaptive}\nmax = {MAX_IN_FLIGHT}\n"));
        }
        if !self.circuit {
            t.push_str("[handlers.circuit]\nenabled = false\n");
        }
        t
    }

    /// The contenders named in `list` (comma-separated), in [`LIMITS`] order.
    pub(crate) fn parse_list(list: &str) -> anyhow::Result<Vec<Limit>> {
        let names: Vec<&str> = list.split(',').map(str::trim).filter(|s| !s.is_empty()).collect();
        for n in &names {
            if !LIMITS.iter().any(|l| l.name() == *n) {
                let known: Vec<&str> = LIMITS.iter().map(|l| l.name()).collect();
                bail!("unknown overload contender {n} (known: {})", known.join(", "));
            }
        }
        Ok(LIMITS.into_iter().filter(|l| names.contains(&l.name())).collect())
    }
}

#[derive(Debug, Clone, Default)]
pub(crate) struct OverloadResult {
    pub(crate) events: u64,
    /// Events answered 2xx per second, first call → the last event's first 2xx.
    pub(crate) eps: f64,
    /// First call → the last event's first 2xx, s.
    pub(crate) secs: f64,
    /// Produce time → 2xx, ms.
    pub(crate) p99_ms: f64,
    pub(crate) p50_ms: f64,
    /// An event's first call → its first 2xx, ms (what its retries cost it).
    pub(crate) retry_p99_ms: f64,
    pub(crate) calls: u64,
    pub(crate) unavailable: u64,
    pub(crate) repeats: u64,
    /// Calls in flight at the receiver, sampled every 20 ms: p10, p50, p90.
    pub(crate) in_flight: (f64, f64, f64),
    /// outboxd's `outboxd_handler_concurrency_limit`, sampled every 250 ms: p10,
    /// p50, p90, min, max; None = not exported.
    pub(crate) limit: Option<[f64; 5]>,
    /// Times the circuit opened (`outboxd_handler_circuit_transitions_total{to="open"}`)
    /// and seconds it was not closed (`outboxd_handler_circuit_open_seconds`); None =
    /// this build exports neither.
    pub(crate) circuit: Option<(f64, f64)>,
    /// `outboxd_events_retried_total`, summed over topics.
    pub(crate) retried: f64,
    /// Stopped at the cap before every event was answered 2xx.
    pub(crate) partial: bool,
}

impl OverloadResult {
    pub(crate) fn per_1000(&self, n: u64) -> f64 {
        n as f64 * 1000.0 / self.events.max(1) as f64
    }
    pub(crate) fn calls_per_event(&self) -> f64 {
        self.calls as f64 / self.events.max(1) as f64
    }
}

const DEAD: &str = "outboxd_events_dead_total";
const RETRIED: &str = "outboxd_events_retried_total";
const CIRCUIT: &str = "outboxd_handler_circuit_transitions_total";
const CIRCUIT_OPEN_SECONDS: &str = "outboxd_handler_circuit_open_seconds";
const LIMIT: &str = "outboxd_handler_concurrency_limit";
/// How often the limit is read from `/metrics` (each read renders the whole page).
const LIMIT_EVERY: Duration = Duration::from_millis(250);

/// All series of `name` added up (0 when there are none).
fn sum(text: &str, name: &str) -> f64 {
    metric_series(text, name).iter().fold(0.0, |a, s| a + s.1)
}

/// One contender on a fresh topic: it is assigned the empty topic, then `n`
/// events are produced at once (faster than the receiver takes them: a backlog,
/// stamped with their produce time) and drained.
pub(crate) async fn overload_run(b: &Bench, who: Limit, n: u64, rep: usize) -> anyhow::Result<OverloadResult> {
    let name = format!("overload-{}-{rep}", who.name());
    let topic = b.topic(&format!("overload.{}.{rep}", who.name()));
    b.create_topic(&topic, PARTITIONS).await?;
    let group = format!("bench-{}-{name}", b.run_id);
    let (cfg, admin) = b.write_config(&Cfg {
        name,
        group: group.clone(),
        topics: vec![topic.clone()],
        handler: Hk::Http,
        fsync: true,
        max_in_flight: MAX_IN_FLIGHT,
        commit_window: None,
        retention: "7d",
        gc_interval: "10m",
        drain_timeout: "10s",
        store_extra: String::new(),
        kafka_extra: Vec::new(),
        handler_extra: who.handler_extra(),
    })?;
    b.recv.reset_overloaded(MODEL);
    let mut child = b.spawn(Contender::Outboxd, &cfg, "", QUIET_LOG)?;
    child.wait_assigned().await?;
    let (brokers, t) = (b.args.brokers.clone(), topic.clone());
    let salt = 0x0e1d + rep as u64;
    let producing = tokio::task::spawn_blocking(move || preload(&brokers, &t, salt, n, OVERLOAD_KEYS, false));
    // Ten times what the receiver does at its knee, and a minute to start.
    let cap = Duration::from_secs(60) + Duration::from_secs_f64(10.0 * n as f64 / MODEL.throughput(MODEL.knee));
    let t0 = Instant::now();
    let mut samples: Vec<i64> = Vec::new();
    let (mut limits, mut limit_at): (Vec<i64>, Instant) = (Vec::new(), Instant::now());
    let partial = loop {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let (done, in_flight) = b.recv.progress();
        if b.recv.first_call().is_some() {
            samples.push(in_flight as i64);
            if limit_at.elapsed() >= LIMIT_EVERY {
                limit_at = Instant::now();
                let text = metrics_text(admin).await.unwrap_or_default();
                limits.extend(metric_series(&text, LIMIT).first().map(|s| s.1 as i64));
            }
        }
        if done >= n {
            break false;
        }
        if t0.elapsed() > cap {
            break true;
        }
        child.check_alive()?;
    };
    producing.await??;
    let metrics = metrics_text(admin).await.unwrap_or_default();
    let dead = sum(&metrics, DEAD);
    if dead > 0.0 {
        child.stop(Duration::from_secs(30)).await?;
        b.topics.add(format!("{group}.{topic}.outboxd-dedup"));
        bail!("overload {}: {dead} events dead (retries used up): the scenario measures nothing then", who.name());
    }
    if !partial {
        // Every event answered: its done record follows, then the offset commit.
        let watch = GroupWatch::new(&b.args.brokers, &group, &topic, PARTITIONS)?;
        let t1 = Instant::now();
        while watch.committed() < n as i64 {
            if t1.elapsed() > Duration::from_secs(60) {
                bail!("overload {}: all {n} events answered, but not all committed after 60 s", who.name());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let metrics = metrics_text(admin).await.unwrap_or_default();
    let circuit = (metrics.contains(CIRCUIT) || metrics.contains(CIRCUIT_OPEN_SECONDS)).then(|| {
        let opens =
            metric_series(&metrics, CIRCUIT).iter().filter(|s| s.0.contains("to=\"open\"")).fold(0.0, |a, s| a + s.1);
        (opens, sum(&metrics, CIRCUIT_OPEN_SECONDS))
    });
    let retried = sum(&metrics, RETRIED);
    child.stop(Duration::from_secs(30)).await?;
    // Its changelog topic goes with the suite's topics at the end.
    b.topics.add(format!("{group}.{topic}.outboxd-dedup"));
    let _ = std::fs::remove_dir_all(b.work.join("stores").join(format!("overload-{}-{rep}", who.name())));

    let i = b.recv.inner.lock().unwrap();
    let (first, last) = (i.first.unwrap_or(t0), i.last_new_ok.unwrap_or(t0));
    let done = i.keys_answered();
    let mut lat: Vec<i64> = i.lat.iter().map(|(_, l)| *l).collect();
    lat.sort_unstable();
    let mut retry: Vec<i64> = i.retry_lat.clone();
    retry.sort_unstable();
    samples.sort_unstable();
    limits.sort_unstable();
    let limit = (!limits.is_empty()).then(|| {
        let p = |q| pct(&limits, q);
        [p(0.1), p(0.5), p(0.9), limits[0] as f64, limits[limits.len() - 1] as f64]
    });
    let secs = (last - first).as_secs_f64().max(1e-3);
    let r = OverloadResult {
        events: done,
        eps: done as f64 / secs,
        secs,
        p99_ms: pct(&lat, 0.99) / 1000.0,
        p50_ms: pct(&lat, 0.5) / 1000.0,
        retry_p99_ms: pct(&retry, 0.99) / 1000.0,
        calls: i.calls,
        unavailable: i.unavailable,
        repeats: i.repeats,
        in_flight: (pct(&samples, 0.1), pct(&samples, 0.5), pct(&samples, 0.9)),
        limit,
        circuit,
        retried,
        partial,
    };
    drop(i);
    eprintln!(
        "bench: overload {:<16} run {rep}: {:>5.0} events/s, p50 {:.0} ms p99 {:.0} ms from produce, p99 {:.0} ms first call → 2xx, {} calls ({} 503, {:.2} per event; outboxd retried {:.0}), {} repeats, in flight p10/p50/p90 {:.0}/{:.0}/{:.0}, limit {}, circuit {}{}",
        who.name(),
        r.eps,
        r.p50_ms,
        r.p99_ms,
        r.retry_p99_ms,
        r.calls,
        r.unavailable,
        r.calls_per_event(),
        r.retried,
        r.repeats,
        r.in_flight.0,
        r.in_flight.1,
        r.in_flight.2,
        match r.limit {
            None => "not exported".to_owned(),
            Some([p10, p50, p90, lo, hi]) => format!("p10/p50/p90 {p10:.0}/{p50:.0}/{p90:.0} (min {lo:.0}, max {hi:.0})"),
        },
        match r.circuit {
            None => "not exported".to_owned(),
            Some((opens, secs)) => format!("opened {opens:.0} times, not closed for {secs:.1} s"),
        },
        if partial { format!(" [stopped after {cap:?}: {done} of {n} answered 2xx]") } else { String::new() },
    );
    Ok(r)
}
