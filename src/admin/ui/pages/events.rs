//! The events list: records filtered by state, topic, type, reason and time, read in bounded chunks from a cursor.

use std::time::SystemTime;

use askama::Template;
use askama_web::WebTemplate;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::super::console::{Shared, Viewer};
use super::super::format::{self, When};
use super::chrome::*;
use super::groups::group_query;
use crate::store::{page_cursor, Record, State as RecordState};

/// Rows on one page of the events list.
const PAGE_ROWS: usize = 50;
/// Records one events page examines at most while looking for rows that match its
/// filters (state, topic, reason text, type, time): a rare match among a million
/// records costs a few pages, each answered in milliseconds, never one slow page.
/// Dead and parked records come from their index, which holds nothing else.
const SCAN_BUDGET: usize = 5_000;
/// Records read from the store at a time while filling a page.
const CHUNK: usize = 500;

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
    /// The reason group (what [`crate::store::reason_group`] makes of a reason), exactly.
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
            && self.group.as_ref().is_none_or(|g| crate::store::reason_group(r.reason.as_deref().unwrap_or("")) == *g)
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

impl EventRow {
    fn of(r: &Record, now: SystemTime) -> EventRow {
        EventRow {
            link: link(&r.event_id),
            id: r.event_id.to_string(),
            state: r.state.to_string(),
            topic: r.topic.to_string(),
            position: format!("{}@{}", r.partition, r.offset),
            attempts: r.attempts,
            event_type: r.event_type.as_deref().unwrap_or_default().to_owned(),
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
        // The state and topic are matched by the store, within what is left of the budget.
        let budget = Some(SCAN_BUDGET.saturating_sub(examined).max(1));
        let listed = reads
            .list_page(wanted.state, wanted.topic.as_deref(), cursor.as_deref(), CHUNK, budget)
            .map_err(|e| e.to_string())?;
        let chunk = listed.records;
        let ended = chunk.len() < CHUNK && listed.resume.is_none();
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
        if let Some(resume) = listed.resume {
            // The budget ran out inside the store (records of other states or topics):
            // go on from the last one it looked at.
            return Ok((rows, Some(resume), SCAN_BUDGET));
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
            let read = c.reads.run(move || page(&c2, &wanted, after, SystemTime::now())).await;
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
