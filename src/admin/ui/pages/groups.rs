//! The dead groups: dead and parked events counted by topic and reason, the ids of one group for its actions.

use std::collections::BTreeMap;
use std::time::SystemTime;

use askama::Template;
use askama_web::WebTemplate;
use axum::extract::State;

use super::super::format::{self, When};
use super::super::console::{Shared, Viewer};
use super::chrome::*;
use crate::store::{Record, State as RecordState};

/// Distinct dead groups shown (topic × reason); the rest are summed in one line.
const MAX_GROUPS: usize = 200;

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
