//! The overview: the group, the partitions, the handlers and the store's counts, with a live part refreshed every few seconds.

use std::sync::Arc;
use std::time::{Instant, SystemTime};

use askama::Template;
use askama_web::WebTemplate;
use axum::extract::State;

use super::super::console::{Poller, Shared, Viewer};
use super::super::format::{self, When};
use super::chrome::*;

/// How long a description of the group is shown before it is asked for again:
/// the live overview refreshes every 3 s, the brokers need not answer that often.
pub const MEMBERS_FOR: std::time::Duration = std::time::Duration::from_secs(10);
/// How long the brokers may take to describe the group.
const DESCRIBE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);

/// A member of the group as the overview lists it.
pub struct MemberRow {
    pub client: String,
    pub host: String,
    pub partitions: String,
    /// Whether it is this instance (it holds exactly this instance's partitions).
    pub this: bool,
}

/// The group's members, from a description at most [`MEMBERS_FOR`] old.
async fn members(c: &Shared, ours: &[crate::offsets::PartitionId]) -> (String, Vec<MemberRow>) {
    let group = c.group.get_or_init(|| match crate::kafka::Group::new(&c.exec.config.kafka) {
        Ok(g) => Some(Arc::new(g)),
        Err(error) => {
            tracing::warn!(%error, "the console cannot describe the consumer group");
            None
        }
    });
    let Some(group) = group.clone() else {
        return ("not known (no client to ask the brokers)".into(), Vec::new());
    };
    let mut cached = c.members.lock().await;
    let fresh = cached.as_ref().is_some_and(|(at, _)| at.elapsed() < MEMBERS_FOR);
    if !fresh {
        let described = tokio::task::spawn_blocking(move || group.describe(DESCRIBE_TIMEOUT)).await;
        let described = match described {
            Ok(r) => r.map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        *cached = Some((Instant::now(), described));
    }
    match cached.as_ref().map(|(_, r)| r) {
        Some(Ok(view)) => {
            let rows = view
                .members
                .iter()
                .map(|m| MemberRow {
                    client: m.client_id.clone(),
                    host: m.host.clone(),
                    partitions: if m.partitions.is_empty() {
                        "none".into()
                    } else {
                        crate::offsets::describe(&m.partitions)
                    },
                    this: !ours.is_empty() && m.partitions == ours,
                })
                .collect();
            (view.state.clone(), rows)
        }
        Some(Err(e)) => (format!("not known: {e}"), Vec::new()),
        None => ("not known".into(), Vec::new()),
    }
}

/// The overview's live part, rendered alone every few seconds.
pub struct Live {
    pub group_state: String,
    pub members: Vec<MemberRow>,
    pub version: &'static str,
    pub listen: String,
    pub group_id: String,
    pub started: When,
    pub broker: String,
    pub broker_ok: bool,
    pub draining: bool,
    pub counts: Vec<(String, u64)>,
    pub bytes_on_disk: String,
    pub message_bytes: String,
    pub retention: String,
    pub handled: u64,
    pub duplicates: u64,
    pub dead: u64,
    pub reexecuted: u64,
    pub partitions: Vec<PartitionRow>,
    /// Partitions this instance stands by for: (partition, changelog read up to).
    pub standby: Vec<(String, String)>,
    pub handlers: Vec<HandlerRow>,
    pub now: When,
}

pub struct PartitionRow {
    pub name: String,
    pub state: String,
    pub state_class: &'static str,
    pub committed: String,
    pub end: String,
    pub lag: String,
    pub gap: String,
    pub unfinished: usize,
    pub running: usize,
}

pub struct HandlerRow {
    pub name: String,
    pub calls: u64,
    pub failed: u64,
    /// Calls per second since the last time the overview was rendered.
    pub rate: String,
    pub state: String,
    pub state_class: &'static str,
    pub failures: u32,
    pub open_for: String,
    pub last_failure: String,
    pub transitions: u64,
}

#[derive(Template, WebTemplate)]
#[template(path = "ui/overview.html")]
pub struct OverviewPage {
    pub chrome: Chrome,
    pub live: Live,
}

#[derive(Template, WebTemplate)]
#[template(path = "ui/overview_live.html")]
pub struct OverviewLive {
    pub live: Live,
}

pub async fn overview(State(c): State<Shared>, viewer: Viewer) -> OverviewPage {
    OverviewPage { chrome: Chrome::new(&viewer, "overview"), live: live_with_members(&c).await }
}

pub async fn overview_live(State(c): State<Shared>, _poller: Poller) -> OverviewLive {
    OverviewLive { live: live_with_members(&c).await }
}

async fn live_with_members(c: &Shared) -> Live {
    let mut live = live(c);
    let ours = c.tracker.lock().partitions();
    (live.group_state, live.members) = members(c, &ours).await;
    live
}

fn optional(v: i64) -> String {
    if v >= 0 {
        v.to_string()
    } else {
        "–".into()
    }
}

fn live(c: &Shared) -> Live {
    let now = SystemTime::now();
    let stall = c.exec.config.stall_timeout();
    let (rows, stalled) = {
        let tracker = c.tracker.lock();
        (tracker.overview(Instant::now()), tracker.stalled(Instant::now(), stall))
    };
    let partitions = rows
        .into_iter()
        .map(|p| {
            let (state, state_class) = match (&p.restoring, p.revoking, stalled.contains(&p.id)) {
                (Some((_, 0)), _, _) => ("restoring".to_owned(), "warn"),
                (Some((read, total)), _, _) => {
                    (format!("restoring {read} of {total} ({}%)", read * 100 / (*total).max(1)), "warn")
                }
                (None, true, _) => ("being revoked".to_owned(), "warn"),
                (None, false, true) => (format!("stalled {}", format::rough(p.unmoved_for)), "bad"),
                (None, false, false) => ("handling".to_owned(), "ok"),
            };
            let broker = p.broker;
            let gap = match p.oldest_unfinished {
                Some(o) => format!("offset {o}, waiting {}", format::rough(p.unmoved_for)),
                None => "none".into(),
            };
            PartitionRow {
                name: p.id.to_string(),
                state,
                state_class,
                committed: broker.map_or("–".into(), |b| optional(b.committed)),
                end: broker.map_or("–".into(), |b| optional(b.end)),
                lag: broker.map_or("–".into(), |b| optional(b.lag)),
                gap,
                unfinished: p.unfinished,
                running: p.running,
            }
        })
        .collect();
    let calls = c.exec.handler_calls();
    let rates = c.rates(&calls);
    let handlers = c
        .exec
        .circuits()
        .all()
        .iter()
        .map(|circuit| {
            let v = circuit.view();
            let i = calls.iter().position(|(name, _, _)| *name == v.handler);
            let (calls, failed) = i.map_or((0, 0), |i| (calls[i].1, calls[i].2));
            let rate = i.and_then(|i| rates[i]).map_or_else(String::new, |r| format!("{r:.1}/s"));
            let state_class = match v.state.as_str() {
                "closed" => "ok",
                "half_open" => "warn",
                _ => "bad",
            };
            HandlerRow {
                calls,
                failed,
                rate,
                open_for: v
                    .open_for_seconds
                    .map_or(String::new(), |s| format::rough(std::time::Duration::from_secs_f64(s))),
                last_failure: v.last_failure.clone().unwrap_or_default(),
                name: v.handler,
                state: v.state.replace('_', "-"),
                state_class,
                failures: v.failures,
                transitions: v.transitions,
            }
        })
        .collect();
    let standby = c.tracker.lock().standby();
    let changelog = c.exec.config.store.changelog.as_ref();
    let standby = standby
        .into_iter()
        .map(|p| {
            let checkpoint =
                changelog.and_then(|ch| c.exec.store.restore().checkpoint(&ch.topic_for(&p.topic), p.partition));
            (p.to_string(), checkpoint.map_or_else(|| "nothing yet".to_owned(), |o| format!("offset {o}")))
        })
        .collect();
    let reads = c.exec.store.reads();
    let brokers = c.broker.status();
    let counters = &c.exec.counters;
    let load = |n: &std::sync::atomic::AtomicU64| n.load(std::sync::atomic::Ordering::Relaxed);
    Live {
        group_state: String::new(),
        members: Vec::new(),
        version: env!("CARGO_PKG_VERSION"),
        listen: c.listen.to_string(),
        group_id: c.exec.config.kafka.group_id.clone(),
        started: format::at(c.started, now),
        broker: brokers.state.as_str().replace('_', " "),
        broker_ok: brokers.state == crate::kafka::Reachability::Reachable,
        draining: c.exec.stopped(),
        counts: reads.counts().iter().map(|(s, n)| (s.to_string(), *n)).collect(),
        bytes_on_disk: reads.bytes_on_disk().map_or_else(|e| format!("unknown ({e})"), format::bytes),
        message_bytes: format::bytes(reads.message_bytes()),
        retention: humantime::format_duration(c.exec.config.store.retention).to_string(),
        handled: load(&counters.handled),
        duplicates: load(&counters.duplicates),
        dead: load(&counters.dead),
        reexecuted: load(&counters.reexecuted),
        partitions,
        standby,
        handlers,
        now: format::at(now, now),
    }
}
