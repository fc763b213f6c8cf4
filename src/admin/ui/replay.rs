//! Replay a window: the form, the impact (how many events, of which states, and
//! which of them the topic no longer holds) before anything runs, then the typed
//! phrase ("replay 37"), and the run as a job ([`super::jobs`]) whose page shows
//! its progress. What `outboxd store replay` does, in the service.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use askama::Template;
use askama_web::WebTemplate;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use axum::Form;
use serde::Deserialize;

use super::console::{Shared, Viewer};
use super::jobs::{Action, Job};
use super::pages::Chrome;
use crate::ops::{self, Window};
use crate::wire::{RecordView, ReplayView};

/// Ids listed on the impact (the count covers all).
const IDS_LISTED: usize = 20;

/// The window, as the form sends it.
#[derive(Debug, Default, Clone, Deserialize)]
pub struct WindowForm {
    #[serde(default)]
    pub topic: String,
    #[serde(default, rename = "type")]
    pub event_type: String,
    /// `done`, `dead`, `parked`, or empty for all three.
    #[serde(default)]
    pub state: String,
    #[serde(default)]
    pub since: String,
    #[serde(default)]
    pub until: String,
    /// "on" when new idempotency keys are asked for.
    #[serde(default)]
    pub new_key: String,
}

impl WindowForm {
    fn asked(&self) -> bool {
        !self.topic.trim().is_empty() && !self.since.trim().is_empty()
    }

    fn window(&self) -> Result<Window, String> {
        let states = match self.state.trim() {
            "" => Vec::new(),
            s => vec![s.parse::<crate::store::State>().map_err(|e| e.to_string())?],
        };
        let until = Some(self.until.trim()).filter(|u| !u.is_empty());
        Window::new(&self.topic, Some(&self.event_type), states, &self.since, until).map_err(|e| e.to_string())
    }

    fn new_key(&self) -> bool {
        self.new_key == "on"
    }
}

/// What the window holds, for the page.
pub struct Impact {
    /// Events that would run again.
    pub count: usize,
    /// `3 done, 1 dead`.
    pub states: String,
    pub impact: String,
    pub ids: Vec<String>,
    /// Per partition the topic no longer holds some of: a line each.
    pub expired: Vec<String>,
    pub phrase: String,
}

#[derive(Template, WebTemplate)]
#[template(path = "ui/replay.html")]
pub struct ReplayPage {
    pub chrome: Chrome,
    pub form: WindowForm,
    pub impact: Option<Impact>,
    pub error: Option<String>,
}

/// The records of the window that the topic still holds, and the impact page's account.
async fn look(c: &Shared, window: &Window) -> Result<(Vec<RecordView>, Impact), String> {
    let (local, w) = (c.local.clone(), window.clone());
    let records = c.reads.run(move || ops::select_here(&local, &w)).await.map_err(|e| e.to_string())?;
    let records = records.map_err(|e| e.to_string())?;
    let firsts = c.rereads.first_offsets(&c.exec.config.kafka, &records).await.map_err(|e| crate::error::with_causes(&e))?;
    let held_by_topic =
        |r: &RecordView| firsts.get(&(r.topic.clone(), r.partition)).is_none_or(|first| r.offset >= *first);
    let (kept, gone): (Vec<RecordView>, Vec<RecordView>) = records.into_iter().partition(held_by_topic);
    let mut states: BTreeMap<String, usize> = BTreeMap::new();
    for r in &kept {
        *states.entry(r.state.to_string()).or_default() += 1;
    }
    let mut per: BTreeMap<(String, i32), usize> = BTreeMap::new();
    for r in &gone {
        *per.entry((r.topic.clone(), r.partition)).or_default() += 1;
    }
    let expired = per
        .iter()
        .map(|((t, p), n)| {
            let first = firsts.get(&(t.clone(), *p)).copied().unwrap_or_default();
            format!("{t}/{p}: {n} event(s) below offset {first}, where the partition begins now")
        })
        .collect();
    let impact = Impact {
        count: kept.len(),
        states: states.iter().map(|(s, n)| format!("{n} {s}")).collect::<Vec<_>>().join(", "),
        impact: Action::Replay.impact(kept.len()),
        ids: kept.iter().take(IDS_LISTED).map(|r| r.event_id.clone()).collect(),
        expired,
        phrase: format!("replay {}", kept.len()),
    };
    Ok((kept, impact))
}


/// The form, and with a window asked for, what it holds and the form that runs it.
pub async fn page(State(c): State<Shared>, viewer: Viewer, Query(form): Query<WindowForm>) -> Response {
    let chrome = Chrome::new(&viewer, "replay");
    if !form.asked() {
        return ReplayPage { chrome, form, impact: None, error: None }.into_response();
    }
    let looked = match form.window() {
        Ok(window) => look(&c, &window).await,
        Err(e) => Err(e),
    };
    match looked {
        Ok((_, impact)) => ReplayPage { chrome, form, impact: Some(impact), error: None }.into_response(),
        Err(e) => {
            (StatusCode::BAD_REQUEST, ReplayPage { chrome, form, impact: None, error: Some(e) }).into_response()
        }
    }
}

#[derive(Deserialize)]
pub struct RunForm {
    #[serde(flatten)]
    window: WindowForm,
    /// The count the impact showed.
    #[serde(default)]
    count: usize,
    /// The phrase typed.
    #[serde(default)]
    confirm: String,
    /// Why, for the audit (optional).
    #[serde(default)]
    reason: String,
}

/// Runs the replay as a job once its confirmation holds; answers with the job's page.
pub async fn run(State(c): State<Shared>, viewer: Viewer, Form(f): Form<RunForm>) -> Response {
    if !viewer.0.can_act() {
        tracing::warn!(who = %viewer.0.who, "console replay refused: read-only credential");
        return (StatusCode::FORBIDDEN, "this login can look but not act (a read-only token)").into_response();
    }
    let chrome = Chrome::new(&viewer, "replay");
    let again = |impact: Option<Impact>, error: String| {
        let page = ReplayPage { chrome: Chrome::new(&viewer, "replay"), form: f.window.clone(), impact, error: Some(error) };
        (StatusCode::UNPROCESSABLE_ENTITY, page).into_response()
    };
    let looked = match f.window.window() {
        Ok(window) => look(&c, &window).await,
        Err(e) => Err(e),
    };
    let (records, impact) = match looked {
        Ok(looked) => looked,
        Err(e) => return (StatusCode::BAD_REQUEST, ReplayPage { chrome, form: f.window, impact: None, error: Some(e) }).into_response(),
    };
    if records.len() != f.count {
        let error = format!("The window changed: it has {} events now, not {}. Check again.", records.len(), f.count);
        return again(Some(impact), error);
    }
    if records.is_empty() {
        return again(Some(impact), "Nothing to replay.".into());
    }
    if f.confirm.trim() != impact.phrase {
        let error = format!("Type \u{201c}{}\u{201d} to confirm.", impact.phrase);
        return again(Some(impact), error);
    }
    let actor = match ops::Actor::new(viewer.0.who.clone(), Some(f.reason.as_str())) {
        Ok(actor) => actor,
        Err(e) => return again(Some(impact), e.to_string()),
    };
    let suffix = match f.window.new_key() {
        true => match ops::new_key_suffix(&ops::new_key_token()) {
            Ok(s) => Some(s),
            Err(e) => return again(Some(impact), e.to_string()),
        },
        false => None,
    };
    let job = c.jobs.add(Action::Replay, &viewer.0.who, records.len());
    tracing::info!(who = %viewer.0.who, topic = %f.window.topic, events = records.len(), job = job.id, "console replay started");
    let turns = c.jobs.turns.clone();
    let (c2, j) = (c.clone(), job.clone());
    tokio::spawn(async move {
        let _turn = turns.acquire_owned().await.expect("the jobs' semaphore is never closed");
        carry_out(&c2, &j, &records, suffix.as_deref(), &actor).await;
    });
    Redirect::to(&format!("/ui/jobs/{}", job.id)).into_response()
}

/// Replays each record in turn; stops at the first that fails, so that no later
/// event of its key overtakes it.
async fn carry_out(c: &Shared, job: &Job, records: &[RecordView], suffix: Option<&str>, actor: &ops::Actor) {
    for r in records {
        match ops::replay_by(&c.exec, &c.rereads, ops::scope_of(r), &r.event_id, suffix, actor).await {
            Ok(ReplayView::Ran { .. }) => {
                job.done.fetch_add(1, Ordering::Relaxed);
            }
            Ok(ReplayView::Expired { first_offset }) => job.failed_on(
                &r.event_id,
                format!("the topic no longer holds it (the partition begins at {first_offset} now)"),
            ),
            Ok(ReplayView::Missing) => job.failed_on(&r.event_id, "the partition does not hold its offset".into()),
            Ok(ReplayView::NotRun { .. }) => {
                job.failed_on(&r.event_id, "no route takes it under this record now; left as it was".into())
            }
            Ok(ReplayView::Other { event_id }) => job.failed_on(
                &r.event_id,
                format!("another event ({event_id}) is at its offset now (was the topic created again?)"),
            ),
            Err(e) => {
                tracing::warn!(event_id = %r.event_id, error = %e, "console replay stopped at an event");
                job.failed_on(&r.event_id, format!("{} (the replay stopped here)", crate::error::with_causes(&e)));
                break;
            }
        }
    }
    job.finished.store(true, Ordering::Relaxed);
    tracing::info!(who = %job.who, job = job.id, done = job.done.load(Ordering::Relaxed),
        failed = job.failed.load(Ordering::Relaxed), "console replay finished");
}
