//! The dead groups: dead and parked events counted by topic and reason, from the
//! counts the store keeps as records change (no record is read), and the ids of one
//! group for its actions, from the store's index of dead and parked records.

use std::time::SystemTime;

use askama::Template;
use askama_web::WebTemplate;
use axum::extract::State;

use super::super::console::{Shared, Viewer};
use super::super::format::{self, When};
use super::chrome::*;
use crate::store::State as RecordState;

/// Distinct dead groups shown (topic × reason); the rest are summed in one line.
const MAX_GROUPS: usize = 200;

/// What the page says while a store written before the index is being indexed.
const INDEXING: &str = "The dead and parked events of this store are being indexed (once, after an upgrade); \
                        their groups show when that is done. The events list shows them meanwhile.";

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

/// The ids of one group, in id order (blocking): from the store's index of dead and
/// parked records, so what it costs is what there is of them.
pub fn group_ids(c: &Shared, state: RecordState, topic: &str, group: &str) -> Result<Vec<String>, String> {
    match c.exec.store.reads().problem_ids(state, topic, group) {
        Ok(Some(ids)) => Ok(ids),
        Ok(None) => Err(INDEXING.to_owned()),
        Err(e) => Err(e.to_string()),
    }
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
    let Some(counted) = c.exec.store.reads().problem_groups() else {
        return GroupsPage { chrome, groups: Vec::new(), more: 0, error: Some(INDEXING.to_owned()) };
    };
    let now = SystemTime::now();
    let at = |us: i64| format::at_us(us, now);
    // The largest groups first: they are where a fix pays most.
    let all = crate::store::largest_first(counted);
    let more = all.iter().skip(MAX_GROUPS).map(|(_, g)| g.count).sum();
    let groups = all
        .into_iter()
        .take(MAX_GROUPS)
        .map(|(key, count)| {
            let state = key.state.as_str();
            let query = group_query(state, &key.topic, &key.reason);
            Group {
                list: format!("/ui/events?{query}"),
                state: state.to_owned(),
                reason: shorten(&key.reason, REASON_SHOWN * 2),
                topic: key.topic,
                count: count.count,
                first: at(count.first_us),
                last: at(count.last_us),
                query,
            }
        })
        .collect();
    GroupsPage { chrome, groups, more, error: None }
}
