//! The store's records, stats, audit entries and message copies as the wire
//! views of [`crate::wire`] (what `/v1`, `store … --json`, `store export` and
//! the console show), with each record's held chain.

use super::audit_log::AuditEntry;
use super::base::Store;
use super::chain_index::ChainInfo;
use super::disk::record::Record;
use super::error::StoreError;
use super::read::Stats;
use crate::event::RawMessage;
use crate::wire::{
    rfc3339, AuditEventView, AuditView, BytesView, ChainView, ExportLine, MessageView, RecordView, StatsView,
};

impl From<&Record> for RecordView {
    fn from(r: &Record) -> RecordView {
        RecordView {
            attempts: r.attempts,
            chain: None,
            claimed_at: r.claimed_at_us.map(rfc3339),
            dead_letter: r.dead_letter.clone(),
            done_at: r.done_at_us.map(rfc3339),
            duplicates: r.duplicates,
            event_id: r.event_id.to_string(),
            event_type: r.event_type.as_deref().map(str::to_owned),
            expires_at: r.expires_at_us.map(rfc3339),
            first_seen: rfc3339(r.first_seen_us),
            key: r.key.as_deref().map(str::to_owned),
            offset: r.offset,
            outcome: r.outcome.clone(),
            partition: r.partition,
            reason: r.reason.clone(),
            scope: r.scope.as_deref().map(str::to_owned),
            state: r.state,
            topic: r.topic.to_string(),
            updated_at: rfc3339(r.updated_at_us),
        }
    }
}

/// A record with its held chain (`store get`, `list`, `export` and `/v1`), with at
/// most `shown` ids of the chain's held events.
pub fn record_view(store: &Store, r: &Record, shown: usize) -> RecordView {
    RecordView { chain: store.reads().chain(r, shown).map(ChainView::from), ..RecordView::from(r) }
}

/// Ids of held events `store get` shows (`held_total` counts them all).
pub const CHAIN_SHOWN: usize = 1000;

impl From<ChainInfo> for ChainView {
    fn from(c: ChainInfo) -> ChainView {
        let key = Some(c.chain.key);
        ChainView {
            head: c.head,
            held: c.held,
            held_total: c.held_total,
            key: BytesView::of(&key).expect("a chain has a key"),
        }
    }
}

impl From<&Stats> for StatsView {
    fn from(s: &Stats) -> StatsView {
        StatsView {
            bytes_on_disk: s.bytes_on_disk,
            claimed: s.claimed,
            dead: s.dead,
            done: s.done,
            duplicates_suppressed: s.duplicates_suppressed,
            held: s.held,
            newest: s.newest_us.map(rfc3339),
            oldest: s.oldest_us.map(rfc3339),
            parked: s.parked,
        }
    }
}

impl From<&AuditEntry> for AuditView {
    fn from(e: &AuditEntry) -> AuditView {
        AuditView {
            action: e.action,
            at: rfc3339(e.at_us),
            events: e
                .events
                .iter()
                .map(|ev| AuditEventView {
                    id: ev.id.clone(),
                    partition: ev.source.as_ref().map(|s| s.1),
                    topic: ev.source.as_ref().map(|s| s.0.clone()),
                })
                .collect(),
            outcome: e.outcome.clone(),
            reason: e.reason.clone(),
            who: e.who.clone(),
        }
    }
}

impl From<&RawMessage> for MessageView {
    fn from(m: &RawMessage) -> MessageView {
        MessageView {
            headers: m.headers.iter().map(|(k, v)| (k.clone(), BytesView::of(v))).collect(),
            key: BytesView::of(&m.key),
            offset: m.offset,
            partition: m.partition,
            topic: m.topic.clone(),
            value: BytesView::of(&m.value),
        }
    }
}

/// The export line of `r`: the record, plus the message copy of dead, parked and held events.
pub fn export_line(store: &Store, r: &Record) -> Result<ExportLine, StoreError> {
    Ok(ExportLine { record: record_view(store, r, 0), message: store.message_of(r)?.as_ref().map(MessageView::from) })
}
