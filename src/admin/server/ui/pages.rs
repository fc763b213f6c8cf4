//! The console's pages: what they show and where it comes from. Every read is
//! bounded: the overview uses counts kept as records change (no scan), the events
//! list reads at most [`SCAN_BUDGET`] records per page and goes on from a cursor,
//! and the dead groups read the dead and parked records only.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use askama::Template;
use askama_web::WebTemplate;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::format::{self, When};
use super::{Shared, Viewer};
use crate::event::Payload;
use crate::store::view::{record_view, RecordView, CHAIN_SHOWN};
use crate::store::{page_cursor, Record, State as RecordState};

/// Rows on one page of the events list.
const PAGE_ROWS: usize = 50;
/// Records one events page reads at most while looking for rows that match its
/// filters (reason text, type, time): a rare match among a million records costs
/// a few pages, each answered in milliseconds, never one slow page.
const SCAN_BUDGET: usize = 5_000;
/// Records read from the store at a time while filling a page.
const CHUNK: usize = 500;
/// Distinct dead groups shown (topic × reason); the rest are summed in one line.
const MAX_GROUPS: usize = 200;
/// Characters of a reason shown in a table cell (the event's page shows all of it).
const REASON_SHOWN: usize = 160;

/// What every page's frame needs: who is logged in, whether they may act, where they are.
pub struct Chrome {
    pub who: String,
    pub can_act: bool,
    pub nav: &'static str,
}

impl Chrome {
    pub fn new(viewer: &Viewer, nav: &'static str) -> Chrome {
        Chrome { who: viewer.0.who.clone(), can_act: viewer.0.can_act(), nav }
    }
}

#[derive(Template, WebTemplate)]
#[template(path = "ui/login.html")]
pub struct LoginPage {
    pub error: Option<String>,
    pub next: String,
}

#[derive(Deserialize)]
pub struct LoginQuery {
    #[serde(default)]
    next: String,
}

pub async fn login_page(Query(q): Query<LoginQuery>) -> LoginPage {
    LoginPage { error: None, next: q.next }
}

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

pub async fn overview_live(State(c): State<Shared>, _viewer: Viewer) -> OverviewLive {
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

/// The events list's filters, as the form and the links carry them.
#[derive(Debug, Default, Clone, Deserialize)]
pub struct Filter {
    #[serde(default)]
    pub state: String,
    #[serde(default)]
    pub topic: String,
    /// Text the reason contains (any case).
    #[serde(default)]
    pub reason: String,
    /// The event type, exactly.
    #[serde(default, rename = "type")]
    pub event_type: String,
    /// Last written at or after (a date or an RFC 3339 time, UTC).
    #[serde(default)]
    pub from: String,
    /// Last written before.
    #[serde(default)]
    pub to: String,
    /// The reason group (what [`format::reason_group`] makes of a reason), exactly.
    #[serde(default)]
    pub group: String,
    /// An event id to go to.
    #[serde(default)]
    pub id: String,
    /// The cursor: records after this one.
    #[serde(default)]
    pub after: String,
}

/// What a filter asks of a record, parsed once.
struct Wanted {
    state: Option<RecordState>,
    topic: Option<String>,
    reason: Option<String>,
    group: Option<String>,
    event_type: Option<String>,
    from_us: Option<i64>,
    to_us: Option<i64>,
}

/// A date (`2026-12-01`) or a UTC time (`2026-12-01T10:00:00Z`) in µs since the epoch.
fn time_us(field: &str, text: &str) -> Result<Option<i64>, String> {
    let text = text.trim();
    if text.is_empty() {
        return Ok(None);
    }
    let full = if text.len() == 10 { format!("{text}T00:00:00Z") } else { text.to_owned() };
    let t = humantime::parse_rfc3339_weak(full.trim_end_matches('Z'))
        .map_err(|e| format!("{field}: {text:?} is not a date (2026-12-01) or UTC time (2026-12-01T10:00:00Z): {e}"))?;
    let us = t.duration_since(SystemTime::UNIX_EPOCH).map_err(|e| format!("{field}: {e}"))?.as_micros();
    Ok(Some(us as i64))
}

impl Filter {
    fn wanted(&self) -> Result<Wanted, String> {
        let nonempty = |s: &str| Some(s.trim().to_owned()).filter(|s| !s.is_empty());
        let state = nonempty(&self.state).map(|s| s.parse::<RecordState>()).transpose().map_err(|e| e.to_string())?;
        Ok(Wanted {
            state,
            topic: nonempty(&self.topic),
            reason: nonempty(&self.reason).map(|r| r.to_lowercase()),
            group: Some(self.group.clone()).filter(|g| !g.is_empty()),
            event_type: nonempty(&self.event_type),
            from_us: time_us("from", &self.from)?,
            to_us: time_us("to", &self.to)?,
        })
    }

    /// This filter as a query string, going on after `after`.
    pub fn query(&self, after: &str) -> String {
        let mut q = url::form_urlencoded::Serializer::new(String::new());
        for (k, v) in [
            ("state", &self.state),
            ("topic", &self.topic),
            ("reason", &self.reason),
            ("group", &self.group),
            ("type", &self.event_type),
            ("from", &self.from),
            ("to", &self.to),
        ] {
            if !v.is_empty() {
                q.append_pair(k, v);
            }
        }
        if !after.is_empty() {
            q.append_pair("after", after);
        }
        q.finish()
    }
}

impl Wanted {
    fn matches(&self, r: &Record) -> bool {
        self.reason.as_ref().is_none_or(|t| r.reason.as_deref().is_some_and(|x| x.to_lowercase().contains(t)))
            && self.group.as_ref().is_none_or(|g| format::reason_group(r.reason.as_deref().unwrap_or("")) == *g)
            && self.event_type.as_ref().is_none_or(|t| r.event_type.as_deref() == Some(t.as_str()))
            && self.from_us.is_none_or(|f| r.updated_at_us >= f)
            && self.to_us.is_none_or(|t| r.updated_at_us < t)
    }
}

pub struct EventRow {
    pub id: String,
    pub link: String,
    pub state: String,
    pub topic: String,
    pub position: String,
    pub attempts: u32,
    pub event_type: String,
    pub reason: String,
    pub updated: When,
}

/// The page of event `id`.
pub fn link(id: &str) -> String {
    format!("/ui/event/{}", url::form_urlencoded::byte_serialize(id.as_bytes()).collect::<String>())
}

fn shorten(text: &str, chars: usize) -> String {
    match text.char_indices().nth(chars) {
        Some((i, _)) => format!("{}…", &text[..i]),
        None => text.to_owned(),
    }
}

impl EventRow {
    fn of(r: &Record, now: SystemTime) -> EventRow {
        EventRow {
            link: link(&r.event_id),
            id: r.event_id.clone(),
            state: r.state.to_string(),
            topic: r.topic.clone(),
            position: format!("{}@{}", r.partition, r.offset),
            attempts: r.attempts,
            event_type: r.event_type.clone().unwrap_or_default(),
            reason: shorten(r.reason.as_deref().unwrap_or(""), REASON_SHOWN),
            updated: format::at_us(r.updated_at_us, now),
        }
    }
}

#[derive(Template, WebTemplate)]
#[template(path = "ui/events.html")]
pub struct EventsPage {
    pub chrome: Chrome,
    pub filter: Filter,
    pub error: Option<String>,
    pub rows: Vec<EventRow>,
    /// The link to the next page, when the scan did not reach the end.
    pub next: Option<String>,
    pub examined: usize,
    pub states: Vec<String>,
    /// The group these filters name (state, topic and reason group set), as the
    /// query of an action on all of it.
    pub group_actions: Option<String>,
}

/// One page of the filtered list, read in chunks from the cursor on.
fn page(
    c: &Shared,
    wanted: &Wanted,
    after: Option<String>,
    now: SystemTime,
) -> Result<(Vec<EventRow>, Option<String>, usize), String> {
    let reads = c.exec.store.reads();
    let (mut rows, mut examined, mut cursor) = (Vec::new(), 0, after);
    loop {
        let chunk = reads
            .list_after(wanted.state, wanted.topic.as_deref(), cursor.as_deref(), CHUNK)
            .map_err(|e| e.to_string())?;
        let ended = chunk.len() < CHUNK;
        for r in &chunk {
            examined += 1;
            cursor = Some(page_cursor(r));
            if wanted.matches(r) {
                rows.push(EventRow::of(r, now));
                if rows.len() == PAGE_ROWS {
                    return Ok((rows, cursor, examined));
                }
            }
        }
        if ended {
            return Ok((rows, None, examined));
        }
        if examined >= SCAN_BUDGET {
            return Ok((rows, cursor, examined));
        }
    }
}

pub async fn events(State(c): State<Shared>, viewer: Viewer, Query(f): Query<Filter>) -> Response {
    let id = f.id.trim();
    if !id.is_empty() {
        return axum::response::Redirect::to(&link(id)).into_response();
    }
    let states = RecordState::ALL.iter().map(ToString::to_string).collect();
    let chrome = Chrome::new(&viewer, "events");
    let (rows, next, examined, error) = match f.wanted() {
        Err(e) => (Vec::new(), None, 0, Some(e)),
        Ok(wanted) => {
            let (c2, after) = (c.clone(), Some(f.after.clone()).filter(|a| !a.is_empty()));
            let read = tokio::task::spawn_blocking(move || page(&c2, &wanted, after, SystemTime::now())).await;
            match read {
                Ok(Ok((rows, next, examined))) => (rows, next, examined, None),
                Ok(Err(e)) => (Vec::new(), None, 0, Some(e)),
                Err(e) => (Vec::new(), None, 0, Some(e.to_string())),
            }
        }
    };
    let next = next.map(|after| format!("/ui/events?{}", f.query(&after)));
    let group_actions = ((f.state == "dead" || f.state == "parked") && !f.topic.is_empty() && !f.group.is_empty())
        .then(|| group_query(&f.state, &f.topic, &f.group));
    let status = if error.is_some() { StatusCode::BAD_REQUEST } else { StatusCode::OK };
    (status, EventsPage { chrome, filter: f, error, rows, next, examined, states, group_actions }).into_response()
}

/// Dead (or parked) events of one topic with one reason.
pub struct Group {
    pub state: String,
    pub topic: String,
    pub reason: String,
    pub count: u64,
    pub first: When,
    pub last: When,
    /// The events list with this group's filters.
    pub list: String,
    /// The group's query for an action (`state`, `topic`, `reason`).
    pub query: String,
}

#[derive(Template, WebTemplate)]
#[template(path = "ui/groups.html")]
pub struct GroupsPage {
    pub chrome: Chrome,
    pub groups: Vec<Group>,
    pub more: u64,
    pub error: Option<String>,
}

/// The key a group is counted under: state, topic and the whole reason.
type GroupKey = (&'static str, String, String);

/// Counts the dead and parked records by state × topic × reason (blocking).
fn count_groups(c: &Shared) -> Result<BTreeMap<GroupKey, (u64, i64, i64)>, crate::store::StoreError> {
    let mut groups: BTreeMap<GroupKey, (u64, i64, i64)> = BTreeMap::new();
    for (state, name) in [(RecordState::Dead, "dead"), (RecordState::Parked, "parked")] {
        c.exec.store.reads().scan(Some(state), None, |r: Record| -> Result<(), crate::store::StoreError> {
            let key = (name, r.topic.clone(), format::reason_group(r.reason.as_deref().unwrap_or("")));
            let g = groups.entry(key).or_insert((0, i64::MAX, i64::MIN));
            g.0 += 1;
            g.1 = g.1.min(r.updated_at_us);
            g.2 = g.2.max(r.updated_at_us);
            Ok(())
        })?;
    }
    Ok(groups)
}

/// The ids of one group, in id order (blocking).
pub fn group_ids(
    c: &Shared,
    state: RecordState,
    topic: &str,
    group: &str,
) -> Result<Vec<String>, crate::store::StoreError> {
    let mut ids = Vec::new();
    c.exec.store.reads().scan(Some(state), Some(topic), |r: Record| -> Result<(), crate::store::StoreError> {
        if format::reason_group(r.reason.as_deref().unwrap_or("")) == group {
            ids.push(r.event_id);
        }
        Ok(())
    })?;
    Ok(ids)
}

pub fn group_query(state: &str, topic: &str, group: &str) -> String {
    url::form_urlencoded::Serializer::new(String::new())
        .append_pair("state", state)
        .append_pair("topic", topic)
        .append_pair("group", group)
        .finish()
}

pub async fn groups(State(c): State<Shared>, viewer: Viewer) -> GroupsPage {
    let chrome = Chrome::new(&viewer, "groups");
    let c2 = c.clone();
    let counted = tokio::task::spawn_blocking(move || count_groups(&c2)).await;
    let groups = match counted {
        Ok(Ok(g)) => g,
        Ok(Err(e)) => return GroupsPage { chrome, groups: Vec::new(), more: 0, error: Some(e.to_string()) },
        Err(e) => return GroupsPage { chrome, groups: Vec::new(), more: 0, error: Some(e.to_string()) },
    };
    let now = SystemTime::now();
    let at = |us: i64| format::at_us(us, now);
    let mut all: Vec<(GroupKey, (u64, i64, i64))> = groups.into_iter().collect();
    // The largest groups first: they are where a fix pays most.
    all.sort_by(|a, b| b.1 .0.cmp(&a.1 .0).then_with(|| a.0.cmp(&b.0)));
    let more = all.iter().skip(MAX_GROUPS).map(|(_, (n, _, _))| n).sum();
    let groups = all
        .into_iter()
        .take(MAX_GROUPS)
        .map(|((state, topic, reason), (count, first, last))| {
            let query = group_query(state, &topic, &reason);
            Group {
                list: format!("/ui/events?{query}"),
                state: state.to_owned(),
                topic,
                reason: shorten(&reason, REASON_SHOWN * 2),
                count,
                first: at(first),
                last: at(last),
                query,
            }
        })
        .collect();
    GroupsPage { chrome, groups, more, error: None }
}

/// The stored copy of a dead or parked event's message, as a person reads it.
pub struct MessageCopy {
    pub position: String,
    pub timestamp: Option<When>,
    pub key: String,
    pub headers: Vec<(String, String)>,
    pub payload: String,
    pub payload_kind: &'static str,
    pub decode_error: Option<String>,
    /// The idempotency header the receiver was sent with the event, and its value.
    pub idempotency: Option<(String, String)>,
}

#[derive(Template, WebTemplate)]
#[template(path = "ui/event.html")]
pub struct EventPage {
    pub chrome: Chrome,
    pub id: String,
    pub r: RecordView,
    pub times: Vec<(&'static str, When)>,
    pub message: Option<MessageCopy>,
    /// Its key's held chain, said in a line.
    pub chain: Option<String>,
    /// What people did to it, newest first.
    pub audit: Vec<AuditRow>,
    pub can_rerun: bool,
    pub query: String,
}

#[derive(Template, WebTemplate)]
#[template(path = "ui/missing.html")]
pub struct MissingPage {
    pub chrome: Chrome,
    pub id: String,
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

async fn message_copy(c: &Shared, id: &str) -> Option<MessageCopy> {
    let msg = c.exec.store.reads().message(id).ok().flatten()?;
    let now = SystemTime::now();
    let decoded = c.exec.decode_copy(&msg).await;
    let (payload, payload_kind, decode_error, event_id) = match decoded {
        Some(Ok(event)) => {
            let (text, kind) = match &event.payload {
                Payload::Json(v) => (serde_json::to_string_pretty(v).unwrap_or_default(), "JSON"),
                Payload::Text(t) => (t.clone(), "text"),
                Payload::Bytes(b) => (format!("{} bytes that are not UTF-8", b.len()), "bytes"),
                Payload::Null => (String::new(), "null"),
            };
            (text, kind, None, Some(event.id))
        }
        Some(Err(e)) => (msg.value.as_deref().map(text).unwrap_or_default(), "as stored", Some(e.to_string()), None),
        None => (
            msg.value.as_deref().map(text).unwrap_or_default(),
            "as stored",
            Some(format!("no handler covers topic {} any more", msg.topic)),
            None,
        ),
    };
    let idempotency = c.exec.config.handler_for(&msg.topic).and_then(|hc| match &hc.spec {
        crate::config::HandlerSpec::Http(http) => {
            Some((http.idempotency_header.clone()?, event_id.clone().unwrap_or_else(|| id.to_owned())))
        }
        crate::config::HandlerSpec::Log => None,
    });
    Some(MessageCopy {
        position: format!("{}/{}@{}", msg.topic, msg.partition, msg.offset),
        timestamp: msg.timestamp_ms.map(|ms| format::at_us(ms.saturating_mul(1000), now)),
        key: msg.key.as_deref().map(text).unwrap_or_else(|| "(none)".into()),
        headers: msg.headers.iter().map(|(k, v)| (k.clone(), v.as_deref().map(text).unwrap_or_default())).collect(),
        payload,
        payload_kind,
        decode_error,
        idempotency,
    })
}

pub async fn event(State(c): State<Shared>, viewer: Viewer, Path(id): Path<String>) -> Response {
    let chrome = Chrome::new(&viewer, "events");
    let record = c.exec.store.reads().get(&id);
    let r = match record {
        Ok(Some(r)) => record_view(&c.exec.store, &r, CHAIN_SHOWN),
        Ok(None) => return (StatusCode::NOT_FOUND, MissingPage { chrome, id }).into_response(),
        Err(e) => return (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    };
    let now = SystemTime::now();
    let mut times = vec![("first seen", format::when(&r.first_seen, now))];
    for (label, t) in [("claimed", &r.claimed_at), ("final", &r.done_at), ("expires", &r.expires_at)] {
        if let Some(t) = t {
            times.push((label, format::when(t, now)));
        }
    }
    times.push(("last written", format::when(&r.updated_at, now)));
    let message = message_copy(&c, &id).await;
    let can_rerun = matches!(r.state, RecordState::Dead | RecordState::Parked);
    let query = url::form_urlencoded::Serializer::new(String::new()).append_pair("id", &id).finish();
    let chain = r.chain.as_ref().filter(|ch| ch.held_total > 0).map(|ch| match &ch.head {
        Some(head) if *head == id => format!("{} later events of its key are held behind it", ch.held_total),
        Some(head) => format!("held behind {head}, with {} events of its key", ch.held_total),
        None => format!("released: its {} held events run in order", ch.held_total),
    });
    let audit = c.local.audit_of(&id).map(|entries| entries.iter().map(|v| AuditRow::of(v, now)).collect());
    let audit = audit.unwrap_or_default();
    EventPage { chrome, id, r, times, message, chain, audit, can_rerun, query }.into_response()
}

/// Audit entries on one page.
const AUDIT_ROWS: usize = 100;

/// One audit entry as the pages show it.
pub struct AuditRow {
    pub at: When,
    pub who: String,
    pub action: &'static str,
    /// The events it names, each with the link to its page.
    pub events: Vec<(String, String)>,
    pub reason: String,
    pub outcome: String,
    pub failed: bool,
}

impl AuditRow {
    fn of(v: &crate::store::view::AuditView, now: SystemTime) -> AuditRow {
        AuditRow {
            at: format::when(&v.at, now),
            who: v.who.clone(),
            action: v.action.as_str(),
            events: v.events.iter().map(|e| (e.id.clone(), link(&e.id))).collect(),
            reason: v.reason.clone().unwrap_or_default(),
            failed: v.outcome.starts_with("error"),
            outcome: v.outcome.clone(),
        }
    }
}

#[derive(Template, WebTemplate)]
#[template(path = "ui/audit.html")]
pub struct AuditPage {
    pub chrome: Chrome,
    pub rows: Vec<AuditRow>,
    pub next: Option<String>,
    pub error: Option<String>,
}

#[derive(Deserialize)]
pub struct AuditQuery {
    #[serde(default)]
    before: String,
}

pub async fn audit(State(c): State<Shared>, viewer: Viewer, Query(q): Query<AuditQuery>) -> AuditPage {
    let chrome = Chrome::new(&viewer, "audit");
    let before = Some(q.before).filter(|b| !b.is_empty());
    let (local, now) = (c.local.clone(), SystemTime::now());
    let read = tokio::task::spawn_blocking(move || local.audit(before.as_deref(), AUDIT_ROWS)).await;
    match read {
        Ok(Ok(page)) => AuditPage {
            chrome,
            rows: page.entries.iter().map(|v| AuditRow::of(v, now)).collect(),
            next: page.next.map(|n| {
                format!("/ui/audit?before={}", url::form_urlencoded::byte_serialize(n.as_bytes()).collect::<String>())
            }),
            error: None,
        },
        Ok(Err(e)) => AuditPage { chrome, rows: Vec::new(), next: None, error: Some(e.to_string()) },
        Err(e) => AuditPage { chrome, rows: Vec::new(), next: None, error: Some(e.to_string()) },
    }
}
