//! Metric names and the Prometheus recorder, a leaf that imports nothing of
//! the crate. Code elsewhere records through
//! the `metrics` facade (`metrics::counter!(names::HANDLED, ...)`); only this
//! module knows the exporter.

use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder, PrometheusHandle};

/// Names, so call sites and the dashboard agree.
pub mod names {
    /// Messages consumed from Kafka, per topic.
    pub const CONSUMED: &str = "outboxd_events_consumed_total";
    /// Events whose handler succeeded and whose done record is durable, per topic.
    pub const HANDLED: &str = "outboxd_events_handled_total";
    /// Label `cause`: `redelivered_offset` (same offset again) or `new_offset` (same id elsewhere).
    pub const DUPLICATES: &str = "outboxd_duplicates_suppressed_total";
    /// Events a route passed by (its `event_types` do not select them), per topic and handler.
    pub const FILTERED: &str = "outboxd_events_filtered_total";
    /// Events no route of their topic selected, per topic: nothing ran, the offset moved.
    pub const UNROUTED: &str = "outboxd_events_unrouted_total";
    /// Handler attempts that failed and were retried, per topic.
    pub const RETRIED: &str = "outboxd_events_retried_total";
    /// Events recorded dead (and dead-lettered when configured), per topic.
    pub const DEAD: &str = "outboxd_events_dead_total";
    /// Uncertain events parked for a person (`on_uncertain = "park"`), per topic.
    pub const PARKED: &str = "outboxd_events_parked_total";
    /// Events recorded held behind a dead or parked event of their key (`on_dead = "hold"`), per topic.
    pub const HELD: &str = "outboxd_events_held_total";
    /// Held events run once their chain was released (done, or dead again), per topic.
    pub const RELEASED: &str = "outboxd_held_events_run_total";
    /// Gauge: keys whose new events are held (a dead or parked event holds them).
    pub const KEYS_HELD: &str = "outboxd_keys_held";
    /// Events found claimed (an earlier attempt's outcome unknown) and handled again, per topic.
    pub const REEXECUTED: &str = "outboxd_events_reexecuted_total";
    /// Label `reason`: `unavailable`, `auth` (401/403), `status`, `unparsable`. Events wait meanwhile.
    pub const SCHEMA_REGISTRY_ERRORS: &str = "outboxd_schema_registry_errors_total";
    /// Histogram: the duration of one handler attempt, per topic.
    pub const HANDLER_SECONDS: &str = "outboxd_handler_duration_seconds";
    /// Kafka timestamp → durable done.
    pub const AGE_SECONDS: &str = "outboxd_event_age_seconds";
    /// Gauge: events consumed and not yet finished.
    pub const IN_FLIGHT: &str = "outboxd_in_flight";
    /// Gauge: high watermark minus committed offset, per partition.
    pub const LAG: &str = "outboxd_consumer_lag";
    /// Gauge: the committed offset, per partition.
    pub const COMMITTED: &str = "outboxd_committed_offset";
    /// Gauge: 1 while the brokers are reachable (`/readyz` `broker`), 0 otherwise.
    pub const BROKER_REACHABLE: &str = "outboxd_broker_reachable";
    /// Connection errors librdkafka reported (label `client`: `consumer`, `changelog`,
    /// `dead_letters`, `restore`, `admin`), each a debug line; the log summarizes them.
    pub const BROKER_CONNECTION_ERRORS: &str = "outboxd_broker_connection_errors_total";
    /// Log lines dropped because stderr could not be written (its reader went away).
    pub const LOG_LINES_DROPPED: &str = "outboxd_log_lines_dropped_total";
    /// Spans sent to the OTLP collector and accepted (`[tracing.otlp]`).
    pub const TRACE_SPANS_EXPORTED: &str = "outboxd_trace_spans_exported_total";
    /// Spans not exported, label `reason`: `queue_full` (the export queue was full) or
    /// `export_failed` (the collector was away, refused or timed out). Events go on.
    pub const TRACE_SPANS_DROPPED: &str = "outboxd_trace_spans_dropped_total";
    /// Gauge: records in the store, per `state`.
    pub const RECORDS: &str = "outboxd_store_records";
    /// Gauge: the store's size on disk, in bytes.
    pub const STORE_BYTES: &str = "outboxd_store_bytes_on_disk";
    /// Gauge: memory held by the slices' lookup filters, in bytes (store/disk/filter.rs).
    pub const FILTER_BYTES: &str = "outboxd_store_lookup_filter_bytes";
    /// Gauge: packed runs over all slices (store/disk/runs.rs).
    pub const PACKED_RUNS: &str = "outboxd_store_packed_runs";
    /// Histogram: records made durable by one group commit.
    pub const BATCH: &str = "outboxd_store_commit_batch_records";
    /// Histogram: the duration of one flush + fdatasync of the store.
    pub const SYNC_SECONDS: &str = "outboxd_store_sync_seconds";
    /// A bug hit while handling one message: it was recorded dead and its chain went on.
    pub const PANICS: &str = "outboxd_event_panics_total";
    /// Partitions with waiting events whose committable offset has not moved for `kafka.stall_timeout`.
    pub const STALLED: &str = "outboxd_partitions_stalled";
    /// Message copies of failed events not kept because `store.max_message_copy_bytes` was reached.
    pub const COPIES_NOT_KEPT: &str = "outboxd_message_copies_not_kept_total";
    /// Gauge: bytes of message copies of failed events kept in the store.
    pub const COPY_BYTES: &str = "outboxd_store_message_copy_bytes";
    /// Changelog records read into the store by restores (labels `topic`, `partition`: the source partition).
    pub const RESTORED: &str = "outboxd_changelog_records_restored_total";
    /// Changelog records a running restore still has to read (labels `topic`, `partition`).
    pub const RESTORE_LAG: &str = "outboxd_changelog_restore_lag";
    /// Records of the store copied into the changelog (the changelog lacked them: written while it was off).
    pub const PUBLISHED: &str = "outboxd_changelog_records_published_total";
    /// Duration of one partition's restore.
    pub const RESTORE_SECONDS: &str = "outboxd_changelog_restore_seconds";
    /// Partitions assigned and waiting for their restore.
    pub const RESTORING: &str = "outboxd_partitions_restoring";
    /// Gauge: partitions owned by other instances whose changelog this one tails (`store.changelog.standby`).
    pub const STANDBY: &str = "outboxd_partitions_standby";
    /// Changelog records of partitions owned elsewhere applied to the local store (labels `topic`, `partition`).
    pub const STANDBY_APPLIED: &str = "outboxd_changelog_records_standby_applied_total";
    /// Partitions fenced because the group may have given them to another member
    /// (label `cause`: `client`, `gap`, `lost`).
    pub const FENCED: &str = "outboxd_partitions_fenced_total";
    /// Changelog records not applied because their MAC did not check, or because they are older than the
    /// record held for their key (labels `topic`, `partition`, `reason`: `unsigned`, `malformed`,
    /// `unknown_key`, `forged`; `stale`).
    pub const CHANGELOG_REJECTED: &str = "outboxd_changelog_records_rejected_total";
    /// 1 for a handler's circuit state, 0 for the others (labels `handler`, `state`:
    /// `closed`, `open`, `half_open`).
    pub const CIRCUIT: &str = "outboxd_handler_circuit";
    /// Circuit state changes (labels `handler`, `to`).
    pub const CIRCUIT_TRANSITIONS: &str = "outboxd_handler_circuit_transitions_total";
    /// Seconds a handler's circuit has not been closed since start (label `handler`).
    pub const CIRCUIT_OPEN_SECONDS: &str = "outboxd_handler_circuit_open_seconds";
    /// Attempts that failed for the receiver while its circuit was open or that opened it:
    /// not charged to the event's retry budget (label `handler`).
    pub const NOT_CHARGED: &str = "outboxd_handler_attempts_not_charged_total";
    /// A handler's current limit of calls in flight (label `handler`).
    pub const CONCURRENCY: &str = "outboxd_handler_concurrency_limit";
    /// Connections open on the admin server.
    pub const ADMIN_CONNECTIONS: &str = "outboxd_admin_connections";
    /// Admin connections closed at once because `[admin] max_connections` were open.
    pub const ADMIN_CONNECTIONS_REFUSED: &str = "outboxd_admin_connections_refused_total";
    /// Requests of the admin server refused or cut short by its limits (label `reason`:
    /// `request_timeout`, `failures_per_address`, `failures_total`).
    pub const ADMIN_LIMITED: &str = "outboxd_admin_requests_limited_total";
    /// Credentials the admin server refused (a wrong bearer token or console login).
    pub const ADMIN_AUTH_FAILURES: &str = "outboxd_admin_auth_failures_total";
}

const SECONDS_BUCKETS: &[f64] =
    &[0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0];
const BATCH_BUCKETS: &[f64] = &[1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 5000.0];

/// The Prometheus recorder could not be installed (another recorder is set in
/// this process, or a bucket list is invalid); the exporter's text.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct InstallError(#[from] BuildError);

/// Installs the global recorder once; later calls return the same handle.
pub fn install() -> Result<PrometheusHandle, InstallError> {
    static HANDLE: std::sync::OnceLock<PrometheusHandle> = std::sync::OnceLock::new();
    if let Some(h) = HANDLE.get() {
        return Ok(h.clone());
    }
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), SECONDS_BUCKETS)?
        .set_buckets_for_metric(Matcher::Full(names::BATCH.into()), BATCH_BUCKETS)?
        .install_recorder()?;
    describe();
    Ok(HANDLE.get_or_init(|| handle).clone())
}

fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(
        names::PUBLISHED,
        "Records of the store copied into the changelog at start-up (written while the changelog was off)."
    );
    describe_counter!(names::CONSUMED, "Messages consumed from Kafka.");
    describe_gauge!(names::CIRCUIT, "1 for the handler's circuit state (closed, open, half_open), 0 for the others.");
    describe_counter!(names::CIRCUIT_TRANSITIONS, "Circuit state changes of a handler, by the state it went to.");
    describe_gauge!(
        names::CIRCUIT_OPEN_SECONDS,
        Unit::Seconds,
        "Seconds the handler's circuit has been open or half-open since start."
    );
    describe_counter!(
        names::NOT_CHARGED,
        "Attempts that failed for the receiver during an outage (the circuit open): not charged to the event's retry budget."
    );
    describe_gauge!(
        names::CONCURRENCY,
        "The handler's current limit of calls in flight (adaptive: between 1 and its max)."
    );
    describe_counter!(names::HANDLED, "Events whose handler succeeded and whose done record is durable.");
    describe_counter!(names::DUPLICATES, "Deliveries not executed because the event was already final.");
    describe_counter!(names::FILTERED, "Events a route did not select (its event_types), per topic and handler.");
    describe_counter!(names::UNROUTED, "Events no route of their topic selected, per topic.");
    describe_counter!(names::RETRIED, "Handler attempts that failed and were retried.");
    describe_counter!(names::DEAD, "Events recorded dead (and dead-lettered when configured).");
    describe_counter!(names::PARKED, "Uncertain events parked for a person.");
    describe_counter!(
        names::HELD,
        "Events recorded held behind a dead or parked event of their key (on_dead = \"hold\"); they run once it is done, resolved or forgotten."
    );
    describe_counter!(names::RELEASED, "Held events run after their key's chain was released.");
    describe_gauge!(names::KEYS_HELD, "Keys whose new events are held behind a dead or parked event.");
    describe_counter!(names::REEXECUTED, "Events found claimed (outcome unknown) and handled again.");
    describe_counter!(names::SCHEMA_REGISTRY_ERRORS, "Schema lookups that failed and made an event wait, per reason.");
    describe_histogram!(names::HANDLER_SECONDS, Unit::Seconds, "Duration of one handler attempt.");
    describe_histogram!(names::AGE_SECONDS, Unit::Seconds, "From the Kafka timestamp to the durable done record.");
    describe_gauge!(names::IN_FLIGHT, "Events consumed and not yet finished.");
    describe_gauge!(names::LAG, "High watermark minus committed offset, per partition.");
    describe_gauge!(names::COMMITTED, "Committed offset per partition.");
    describe_gauge!(names::BROKER_REACHABLE, "1 while the Kafka brokers are reachable, 0 otherwise.");
    describe_counter!(
        names::BROKER_CONNECTION_ERRORS,
        "Connection errors librdkafka reported, per client; the log summarizes them instead of one line each."
    );
    describe_counter!(names::LOG_LINES_DROPPED, "Log lines dropped because stderr could not be written.");
    describe_counter!(names::TRACE_SPANS_EXPORTED, "Spans the OTLP collector accepted.");
    describe_counter!(
        names::TRACE_SPANS_DROPPED,
        "Spans not exported (queue full, or the collector away), per reason."
    );
    describe_gauge!(names::RECORDS, "Records in the store per state.");
    describe_gauge!(names::STORE_BYTES, Unit::Bytes, "Size of the store on disk.");
    describe_gauge!(names::FILTER_BYTES, Unit::Bytes, "Memory held by the lookup filters of the store's slices.");
    describe_gauge!(names::PACKED_RUNS, "Packed runs over all slices of the store.");
    describe_histogram!(names::BATCH, "Records made durable by one group commit.");
    describe_histogram!(names::SYNC_SECONDS, Unit::Seconds, "Duration of one flush + fdatasync.");
    describe_counter!(
        names::PANICS,
        "Messages whose handling hit a bug (a panic); recorded dead, the partition went on."
    );
    describe_gauge!(
        names::STALLED,
        "Partitions with waiting events whose offset has not moved for kafka.stall_timeout."
    );
    describe_counter!(
        names::COPIES_NOT_KEPT,
        "Message copies of failed events not kept because store.max_message_copy_bytes was reached."
    );
    describe_gauge!(names::COPY_BYTES, Unit::Bytes, "Bytes of message copies of failed events kept in the store.");
    describe_counter!(
        names::RESTORED,
        "Changelog records read into the local store by restores, per source partition."
    );
    describe_gauge!(names::RESTORE_LAG, "Changelog records a running restore still has to read, per source partition.");
    describe_histogram!(
        names::RESTORE_SECONDS,
        Unit::Seconds,
        "Duration of one partition's restore from its changelog."
    );
    describe_gauge!(
        names::STANDBY,
        "Partitions owned by other instances whose changelog this instance tails (store.changelog.standby)."
    );
    describe_counter!(
        names::STANDBY_APPLIED,
        "Changelog records of partitions owned elsewhere applied to the local store, per source partition."
    );
    describe_counter!(
        names::FENCED,
        "Partitions fenced because the group may have given them to another member, per cause."
    );
    describe_counter!(
        names::CHANGELOG_REJECTED,
        "Changelog records not applied because their MAC did not check (store.changelog.key), or because they \
         are older than the record held for their key (stale), per reason."
    );
    describe_gauge!(names::ADMIN_CONNECTIONS, "Connections open on the admin server.");
    describe_counter!(
        names::ADMIN_CONNECTIONS_REFUSED,
        "Admin connections closed at once because [admin] max_connections were open."
    );
    describe_counter!(names::ADMIN_LIMITED, "Admin requests refused or cut short by the server's limits, per reason.");
    describe_counter!(names::ADMIN_AUTH_FAILURES, "Wrong bearer tokens and console logins the admin server refused.");
    describe_gauge!(
        names::RESTORING,
        "Partitions assigned and waiting for their changelog restore (not handled meanwhile)."
    );
}

/// The values of the samples of `name` in `rendered` (the exporter's text) whose labels
/// include each of `labels`, written as `key="value"` (the tests' reading of a render).
#[cfg(test)]
pub(crate) fn samples<'a>(rendered: &'a str, name: &str, labels: &'a [&str]) -> impl Iterator<Item = f64> + 'a {
    let series = format!("{name}{{");
    rendered
        .lines()
        .filter(move |l| l.starts_with(&series) && labels.iter().all(|w| l.contains(w)))
        .map(|l| l.rsplit(' ').next().and_then(|v| v.parse().ok()).expect("a sample's value"))
}
