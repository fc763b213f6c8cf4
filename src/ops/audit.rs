//! Who makes a repair and why ([`Actor`]), and the audit entry every repair made
//! on the store itself leaves, whatever came of it (`store::audit`).

use super::{OpsError, Rerun};
use crate::store::{now_us, AuditAction, AuditEntry, AuditEvent, State, Store};

/// The longest reason a repair may be given (characters): a sentence or two for
/// the person who reads the audit later, not a document; every entry is kept
/// `store.retention` long and goes to the changelog.
pub const MAX_REASON_CHARS: usize = 500;
/// The longest OS user name kept in `cli:<user>` (the names a credential may have are as long).
const MAX_USER_CHARS: usize = 64;

/// Who makes a repair, and why: what its audit entry says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Actor {
    /// The credential's name (`admin`, `local`, an `[[admin.tokens]]` name), or
    /// `cli:<user>` for `outboxd store` on the store itself.
    pub name: String,
    /// Why, as the person said; at most `MAX_REASON_CHARS`.
    pub reason: Option<String>,
}

impl Actor {
    /// `name`, giving `reason` (trimmed; empty is none). Refuses a reason longer
    /// than [`MAX_REASON_CHARS`].
    pub fn new(name: impl Into<String>, reason: Option<&str>) -> Result<Actor, OpsError> {
        let reason = reason.map(str::trim).filter(|r| !r.is_empty());
        if let Some(r) = reason {
            let chars = r.chars().count();
            if chars > MAX_REASON_CHARS {
                return Err(OpsError::ReasonTooLong { chars });
            }
            // One line of text: a terminal escape or a line break in the audit
            // would change what a person reading `store audit` sees.
            if r.chars().any(char::is_control) {
                return Err(OpsError::ReasonNotText);
            }
        }
        Ok(Actor { name: name.into(), reason: reason.map(str::to_owned) })
    }

    /// `outboxd store …` on this machine: `cli:<user>` from `$USER` or `$LOGNAME`
    /// (`cli` when neither is set). Through a running service the service names
    /// the caller by its credential instead.
    pub fn cli(reason: Option<&str>) -> Result<Actor, OpsError> {
        let user = ["USER", "LOGNAME"].iter().find_map(|v| std::env::var(v).ok().filter(|u| !u.is_empty()));
        // A name as the environment says it, without control characters, one table cell long.
        let user = user.map(|u| u.chars().filter(|c| !c.is_control()).take(MAX_USER_CHARS).collect::<String>());
        Actor::new(user.map_or_else(|| "cli".to_owned(), |u| format!("cli:{u}")), reason)
    }
}

/// An event a repair names, with the source partition of its record now (`None`:
/// there is none), so that its entry follows that partition.
pub(super) fn event(store: &Store, id: &str) -> AuditEvent {
    let source = store.reads().get(id).ok().flatten().map(|r| (r.topic.to_string(), r.partition));
    AuditEvent { id: id.to_owned(), source }
}

/// `error: …` with the error's chain.
pub(super) fn failed(e: &dyn std::error::Error) -> String {
    format!("error: {}", crate::error::with_causes(e))
}

/// What a re-run came to, as its entry says: `done`, `held`, `dead again`, ...
pub(super) fn rerun_outcome(rerun: &Rerun) -> String {
    match rerun {
        Rerun::Finished(r) if r.state == State::Done => "done".to_owned(),
        Rerun::Finished(r) if r.state == State::Held => "held".to_owned(),
        Rerun::Finished(r) => format!("{} again", r.state),
        Rerun::Redecoded => "done (recorded under its decoded event id)".to_owned(),
    }
}

/// Records what `actor` did to `events` and what came of it. A failure to record
/// is logged, not answered: the repair is made (or refused) either way, and an
/// entry the changelog did not take is still in the local audit.
pub(super) async fn record(
    store: &Store,
    actor: &Actor,
    action: AuditAction,
    events: Vec<AuditEvent>,
    outcome: String,
) {
    let ids: Vec<String> = events.iter().map(|e| e.id.clone()).collect();
    let entry =
        AuditEntry { at_us: now_us(), who: actor.name.clone(), action, events, reason: actor.reason.clone(), outcome };
    if let Err(error) = store.audit().record(entry).await {
        tracing::error!(%error, who = %actor.name, %action, ids = ?ids, "audit entry not recorded everywhere (the local audit keeps it unless the store failed)");
    }
}
