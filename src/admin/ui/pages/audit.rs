//! The audit: what people did, newest first.

use std::time::SystemTime;

use askama::Template;
use askama_web::WebTemplate;
use axum::extract::{Query, State};
use serde::Deserialize;

use super::super::console::{Shared, Viewer};
use super::super::format::{self, When};
use super::chrome::*;

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
    pub(super) fn of(v: &crate::wire::AuditView, now: SystemTime) -> AuditRow {
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
    let read = c.reads.run(move || local.audit(before.as_deref(), AUDIT_ROWS)).await;
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
