//! Retry, resolve and forget, for one event or a whole group. Each shows what
//! it will do before it runs; a group needs its phrase typed ("retry 37"), so
//! nobody acts on a group by a stray click. The run is a job ([`super::jobs`])
//! whose page shows its progress. A read-only login sees the impact, not the button.

use std::sync::atomic::Ordering;
use std::time::SystemTime;

use askama::Template;
use askama_web::WebTemplate;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use axum::Form;
use serde::Deserialize;

use super::console::{Poller, Shared, Viewer};
use super::format::{self, When};
use super::jobs::{Action, Job};
use super::pages::{group_ids, group_query, link, Chrome};
use crate::ops;
use crate::store::State as RecordState;

/// Ids listed on a confirmation page (the count covers all).
const IDS_LISTED: usize = 20;

/// Which events an action is for: one id, or the group of a state, topic and reason.
#[derive(Debug, Default, Clone, Deserialize)]
pub struct Target {
    #[serde(default)]
    pub action: String,
    #[serde(default)]
    pub id: String,
    #[serde(default)]
    pub state: String,
    #[serde(default)]
    pub topic: String,
    /// The reason group ([`crate::store::reason_group`]).
    #[serde(default)]
    pub group: String,
}

impl Target {
    fn is_group(&self) -> bool {
        self.id.is_empty()
    }

    /// The ids it names now.
    async fn ids(&self, c: &Shared) -> Result<Vec<String>, String> {
        if !self.is_group() {
            return Ok(vec![self.id.clone()]);
        }
        let state = self.state.parse::<RecordState>().map_err(|e| e.to_string())?;
        if !matches!(state, RecordState::Dead | RecordState::Parked) || self.topic.is_empty() {
            return Err("a group is the dead or parked events of one topic with one reason".into());
        }
        let (c, topic, group) = (c.clone(), self.topic.clone(), self.group.clone());
        let reads = c.reads.clone();
        reads.run(move || group_ids(&c, state, &topic, &group)).await.map_err(|e| e.to_string())?
    }
}

#[derive(Template, WebTemplate)]
#[template(path = "ui/confirm.html")]
pub struct ConfirmPage {
    pub chrome: Chrome,
    pub action: &'static str,
    pub target: Target,
    pub impact: String,
    pub count: usize,
    pub ids: Vec<String>,
    /// What must be typed to run it (groups only).
    pub phrase: Option<String>,
    pub error: Option<String>,
    pub back: String,
}

fn confirm_page(viewer: &Viewer, action: Action, target: Target, ids: &[String], error: Option<String>) -> ConfirmPage {
    let back = if target.is_group() {
        format!("/ui/events?{}", group_query(&target.state, &target.topic, &target.group))
    } else {
        link(&target.id)
    };
    ConfirmPage {
        chrome: Chrome::new(viewer, "events"),
        action: action.as_str(),
        impact: action.impact(ids.len()),
        count: ids.len(),
        ids: ids.iter().take(IDS_LISTED).cloned().collect(),
        phrase: target.is_group().then(|| format!("{} {}", action.as_str(), ids.len())),
        target,
        error,
        back,
    }
}

fn bad_request(text: String) -> Response {
    (StatusCode::BAD_REQUEST, text).into_response()
}

/// What an action would do, and the form that runs it.
pub async fn preview(State(c): State<Shared>, viewer: Viewer, Query(t): Query<Target>) -> Response {
    let Some(action) = Action::parse(&t.action) else {
        return bad_request(format!("unknown action {:?}: retry, resolve or forget", t.action));
    };
    match t.ids(&c).await {
        Ok(ids) => confirm_page(&viewer, action, t, &ids, None).into_response(),
        Err(e) => bad_request(e),
    }
}

#[derive(Deserialize)]
pub struct RunForm {
    #[serde(flatten)]
    target: Target,
    /// The count the confirmation page showed.
    #[serde(default)]
    count: usize,
    /// The phrase typed (groups).
    #[serde(default)]
    confirm: String,
    /// Why, for the audit (optional).
    #[serde(default)]
    reason: String,
}

/// Runs an action as a job, once its confirmation holds; answers with the job's page.
pub async fn run(State(c): State<Shared>, viewer: Viewer, Form(f): Form<RunForm>) -> Response {
    if !viewer.0.can_act() {
        tracing::warn!(who = %viewer.0.who, action = %f.target.action, "console action refused: read-only credential");
        return (StatusCode::FORBIDDEN, "this login can look but not act (a read-only token)").into_response();
    }
    let Some(action) = Action::parse(&f.target.action) else {
        return bad_request(format!("unknown action {:?}", f.target.action));
    };
    let ids = match f.target.ids(&c).await {
        Ok(ids) => ids,
        Err(e) => return bad_request(e),
    };
    if f.target.is_group() {
        let phrase = format!("{} {}", action.as_str(), ids.len());
        let error = if ids.len() != f.count {
            Some(format!("The group changed: it has {} events now, not {}. Check again.", ids.len(), f.count))
        } else if f.confirm.trim() != phrase {
            Some(format!("Type \u{201c}{phrase}\u{201d} to confirm."))
        } else {
            None
        };
        if let Some(error) = error {
            return (StatusCode::UNPROCESSABLE_ENTITY, confirm_page(&viewer, action, f.target, &ids, Some(error)))
                .into_response();
        }
    }
    let actor = match ops::Actor::new(viewer.0.who.clone(), Some(f.reason.as_str())) {
        Ok(actor) => actor,
        Err(e) => {
            let page = confirm_page(&viewer, action, f.target, &ids, Some(e.to_string()));
            return (StatusCode::UNPROCESSABLE_ENTITY, page).into_response();
        }
    };
    let job = c.jobs.add(action, &viewer.0.who, ids.len());
    tracing::info!(who = %viewer.0.who, action = action.as_str(), events = ids.len(), job = job.id, "console action started");
    let turns = c.jobs.turns.clone();
    let (c2, j) = (c.clone(), job.clone());
    tokio::spawn(async move {
        let _turn = turns.acquire_owned().await.expect("the jobs' semaphore is never closed");
        carry_out(&c2, &j, &ids, &actor).await;
    });
    Redirect::to(&format!("/ui/jobs/{}", job.id)).into_response()
}

/// Carries the job's action out on each event in turn, each audited under `actor`.
async fn carry_out(c: &Shared, job: &Job, ids: &[String], actor: &ops::Actor) {
    for id in ids {
        let result = match job.action {
            Action::Retry => ops::rerun_by(&c.exec, id, actor).await.map(|_| ()),
            Action::Resolve => c.local.resolve_done_by(id, actor).await.map(|_| ()),
            Action::Forget => c.local.forget_by(id, actor).await.map(|_| ()),
            // Replays select records, not ids, and run from their own page (`super::replay`).
            Action::Replay => {
                job.failed_on(id, "a replay runs from the Replay page".to_owned());
                continue;
            }
        };
        match result {
            Ok(()) => {
                job.done.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                tracing::warn!(event_id = %id, action = job.action.as_str(), error = %e, "console action failed on an event");
                job.failed_on(id, e.to_string());
            }
        }
    }
    job.finished.store(true, Ordering::Relaxed);
    tracing::info!(who = %job.who, action = job.action.as_str(), job = job.id, done = job.done.load(Ordering::Relaxed),
        failed = job.failed.load(Ordering::Relaxed), "console action finished");
}

/// A job's progress as its page shows it.
pub struct Progress {
    pub id: u64,
    pub action: &'static str,
    pub who: String,
    pub started: When,
    pub total: usize,
    pub handled: usize,
    pub done: usize,
    pub failed: usize,
    pub percent: usize,
    pub finished: bool,
    pub failures: Vec<(String, String)>,
}

impl Progress {
    fn of(job: &Job) -> Progress {
        let handled = job.handled();
        Progress {
            id: job.id,
            action: job.action.as_str(),
            who: job.who.clone(),
            started: format::at(job.started, SystemTime::now()),
            total: job.total,
            handled,
            done: job.done.load(Ordering::Relaxed),
            failed: job.failed.load(Ordering::Relaxed),
            percent: handled * 100 / job.total.max(1),
            finished: job.finished.load(Ordering::Relaxed),
            failures: job.failures(),
        }
    }
}

#[derive(Template, WebTemplate)]
#[template(path = "ui/job.html")]
pub struct JobPage {
    pub chrome: Chrome,
    pub p: Progress,
}

#[derive(Template, WebTemplate)]
#[template(path = "ui/job_progress.html")]
pub struct JobProgress {
    pub p: Progress,
}

fn no_job() -> Response {
    (StatusCode::NOT_FOUND, "no such job (jobs are kept until the service restarts)").into_response()
}

pub async fn job(State(c): State<Shared>, viewer: Viewer, Path(id): Path<u64>) -> Response {
    match c.jobs.get(id) {
        Some(job) => {
            let chrome = Chrome::new(&viewer, "events");
            JobPage { chrome, p: Progress::of(&job) }.into_response()
        }
        None => no_job(),
    }
}

pub async fn job_progress(State(c): State<Shared>, _poller: Poller, Path(id): Path<u64>) -> Response {
    match c.jobs.get(id) {
        Some(job) => JobProgress { p: Progress::of(&job) }.into_response(),
        None => no_job(),
    }
}
