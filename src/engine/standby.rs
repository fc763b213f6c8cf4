//! Standby replicas (`store.changelog.standby`; Kafka Streams'
//! `num.standby.replicas`, in its simplest form): besides the partitions it owns,
//! an instance tails the changelog partitions of every other partition of its
//! source topics (all partitions the brokers list, minus the assigned ones), so
//! that taking one over after a failover reads only what was written since its
//! last pass instead of the whole changelog.
//!
//! Every `follow_interval`, each such partition is read from its checkpoint up to
//! the end seen then, with the restore's own steps: [`Store::apply_changelog`] in
//! batches, each followed by `Store::restored_to`, which makes the checkpoint
//! durable together with the records it covers. The pass runs in the restore task
//! between restores, never at the same time as one: a partition assigned here
//! stops being tailed (its restore, then `follow`, own it from then on) and is
//! tailed again once revoked. A pass gives way as soon as a partition waits for
//! its restore: the restore starts from wherever the pass left the checkpoint.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use tracing::{info, warn};

use super::reader::{read_from, Pass, Progress, Reader, Readers, RestoreError};
use super::worker::Shared;
use crate::config::ChangelogConfig;
use crate::metrics::names;
use crate::offsets::PartitionId;

/// How often the brokers are asked which topics and partitions there are: a
/// topic matched by a `topic_pattern`, or one whose changelog topic its first
/// owner just created, is tailed within this long. One metadata request each time.
const METADATA_EVERY: Duration = Duration::from_secs(30);

/// The partitions tailed, and when they are read next.
pub(super) struct Standby {
    /// `store.changelog.standby`: when false, nothing is ever tailed.
    enabled: bool,
    /// `store.changelog.follow_interval`: the time between two passes.
    interval: Duration,
    /// When the last pass began.
    last: Instant,
    /// Every partition of the source topics whose changelog topic exists with the
    /// same partition count, as the brokers said at `sources_at`.
    sources: Vec<PartitionId>,
    /// When `sources` was asked for; `None` until a request succeeded.
    sources_at: Option<Instant>,
    /// The partitions tailed since the last pass: those of `sources` not assigned
    /// here then. Each one entering or leaving it is logged once.
    tailed: BTreeSet<PartitionId>,
}

impl Standby {
    pub(super) fn new(changelog: &ChangelogConfig) -> Standby {
        Standby {
            enabled: changelog.standby,
            interval: changelog.follow_interval,
            last: Instant::now(),
            sources: Vec::new(),
            sources_at: None,
            tailed: BTreeSet::new(),
        }
    }

    /// When an interval has passed: reads the changelogs of the partitions other
    /// instances own up to their ends. Blocking reads run off the runtime's workers.
    pub(super) async fn check(&mut self, readers: &Readers) {
        let (shared, changelog) = (&readers.shared, &readers.changelog);
        if !self.enabled || self.last.elapsed() < self.interval {
            return;
        }
        self.last = Instant::now();
        if self.sources_at.is_none_or(|at| at.elapsed() >= METADATA_EVERY) {
            self.ask_sources(readers).await;
        }
        let wanted = {
            let tracker = shared.tracker.lock();
            standby_partitions(&self.sources, |p| tracker.generation(p).is_some())
        };
        self.log_changes(&wanted, shared, changelog);
        self.tailed = wanted;
        shared.tracker.lock().set_standby(self.tailed.iter().cloned());
        metrics::gauge!(names::STANDBY).set(self.tailed.len() as f64);
        if self.tailed.is_empty() {
            return;
        }
        let (readers, tailed) = (readers.clone(), self.tailed.clone());
        let runtime = tokio::runtime::Handle::current();
        let passed = tokio::task::spawn_blocking(move || {
            for partition in &tailed {
                // Not ours, and no restore waits for this pass to end.
                let keep_going = || {
                    let tracker = readers.shared.tracker.lock();
                    tracker.generation(partition).is_none() && tracker.restoring().is_empty() && readers.running()
                };
                if !keep_going() {
                    continue;
                }
                if let Err(error) = tail(&readers.reader(&runtime), partition, &keep_going) {
                    let doing = "tailing a standby changelog partition";
                    readers.failed(error, partition, doing, "trying again at the next pass");
                    break;
                }
            }
        })
        .await;
        if let Err(error) = passed {
            warn!(%error, "tailing the standby changelog partitions failed; trying again at the next pass");
        }
    }

    /// Partitions assigned here and waiting for their restore: no longer tailed
    /// (logged now, with the checkpoint their restore starts from).
    pub(super) fn hand_over(&mut self, waiting: &[(PartitionId, u64)], shared: &Shared, changelog: &ChangelogConfig) {
        if self.tailed.is_empty() {
            return;
        }
        let wanted: BTreeSet<PartitionId> =
            self.tailed.iter().filter(|p| !waiting.iter().any(|(w, _)| w == *p)).cloned().collect();
        if wanted.len() < self.tailed.len() {
            self.log_changes(&wanted, shared, changelog);
            self.tailed = wanted;
            shared.tracker.lock().set_standby(self.tailed.iter().cloned());
            metrics::gauge!(names::STANDBY).set(self.tailed.len() as f64);
        }
    }

    /// Asks the brokers for the partitions of the source topics (keeps the last
    /// answer when they do not answer).
    async fn ask_sources(&mut self, readers: &Readers) {
        let asked = readers.restorer.clone();
        match tokio::task::spawn_blocking(move || asked.partition_counts()).await {
            Ok(Ok(counts)) => {
                let config = &readers.shared.exec.config;
                self.sources = source_partitions(&counts, |t| config.handler_for(t).is_some(), &readers.changelog);
                self.sources_at = Some(Instant::now());
            }
            Ok(Err(error)) => {
                warn!(%error, "could not list the source partitions to stand by for; asking again at the next pass")
            }
            Err(error) => {
                warn!(%error, "listing the source partitions to stand by for failed; asking again at the next pass")
            }
        }
    }

    /// One log line per partition that starts or stops being tailed.
    fn log_changes(&self, wanted: &BTreeSet<PartitionId>, shared: &Shared, changelog: &ChangelogConfig) {
        let store = &shared.exec.store;
        let checkpoint =
            |p: &PartitionId| store.restore().checkpoint(&changelog.topic_for(&p.topic), p.partition).unwrap_or(-1);
        for p in wanted.difference(&self.tailed) {
            info!(topic = %p.topic, partition = p.partition, changelog_topic = %changelog.topic_for(&p.topic), checkpoint = checkpoint(p),
                "standing by for the partition: tailing its changelog (it is not assigned here)");
        }
        for p in self.tailed.difference(wanted) {
            let reason = if shared.tracker.lock().generation(p).is_some() {
                "assigned here: its restore reads from this checkpoint"
            } else {
                "no longer listed by the brokers"
            };
            info!(topic = %p.topic, partition = p.partition, changelog_topic = %changelog.topic_for(&p.topic), checkpoint = checkpoint(p),
                reason, "no longer standing by for the partition");
        }
    }
}

/// Every partition of the topics in `counts` that are source topics (`is_source`,
/// and not changelog topics themselves) and whose changelog topic exists with
/// the same partition count (one that does not is left to the restore of its
/// owner, which creates it or says what is wrong).
fn source_partitions(
    counts: &BTreeMap<String, i32>,
    is_source: impl Fn(&str) -> bool,
    changelog: &ChangelogConfig,
) -> Vec<PartitionId> {
    counts
        .iter()
        .filter(|(topic, _)| is_source(topic) && !changelog.is_changelog(topic))
        .filter(|(topic, n)| counts.get(&changelog.topic_for(topic)) == Some(n))
        .flat_map(|(topic, n)| (0..*n).map(move |p| PartitionId::new(topic, p)))
        .collect()
}

/// The partitions to stand by for: all source partitions minus those assigned here.
fn standby_partitions(sources: &[PartitionId], assigned: impl Fn(&PartitionId) -> bool) -> BTreeSet<PartitionId> {
    sources.iter().filter(|p| !assigned(p)).cloned().collect()
}

/// One partition: reads its changelog from the checkpoint (or the beginning) up to
/// the end seen now, applying every record, in batches that each move the
/// checkpoint durably with them. Returns how many records were applied.
fn tail(reader: &Reader<'_>, partition: &PartitionId, keep_going: &dyn Fn() -> bool) -> Result<u64, RestoreError> {
    let (topic, p) = (&partition.topic, partition.partition);
    let (changelog_topic, low, end) = reader.range(partition)?;
    let from = read_from(reader.store.restore().checkpoint(&changelog_topic, p), low, end);
    if from >= end {
        return Ok(0);
    }
    let labels = [("topic", topic.clone()), ("partition", p.to_string())];
    let started = Instant::now();
    let progress = |batch: Progress| metrics::counter!(names::STANDBY_APPLIED, &labels).increment(batch.applied);
    let read = reader.read(&Pass::to_end(partition, from, end, false, keep_going, &progress))?;
    // A pass that read more than one batch is a catch-up worth a line (a takeover
    // now restores from `end`); the passes that follow stay quiet.
    if read.complete && read.read >= reader.changelog.restore_batch as u64 {
        info!(%topic, partition = p, changelog_topic, read = read.read, applied = read.applied, checkpoint = end,
            seconds = started.elapsed().as_secs_f64(), "standby caught up with the partition");
    }
    Ok(read.applied)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn changelog() -> ChangelogConfig {
        ChangelogConfig {
            topic_template: "g.{topic}.outboxd-dedup".into(),
            replication_factor: None,
            linger: Duration::from_millis(1),
            delivery_timeout: Duration::from_secs(30),
            restore_batch: 10,
            restore_batch_bytes: 1 << 20,
            restore_run_bytes: 1 << 20,
            max_clock_skew: Duration::ZERO,
            publish_batch: 10,
            follow_interval: Duration::from_secs(1),
            standby: true,
            keys: None,
        }
    }

    fn p(topic: &str, partition: i32) -> PartitionId {
        PartitionId::new(topic, partition)
    }

    #[test]
    fn every_partition_of_a_source_topic_with_a_fitting_changelog_is_a_source_partition() {
        let counts: BTreeMap<String, i32> = [
            ("orders", 3),
            ("g.orders.outboxd-dedup", 3),
            // Its changelog topic does not exist yet: its first owner creates it.
            ("payments", 2),
            // A partition-count mismatch: the owner's restore says so; nothing to tail.
            ("users", 2),
            ("g.users.outboxd-dedup", 1),
            // Not read by any handler.
            ("other", 4),
            ("g.other.outboxd-dedup", 4),
        ]
        .into_iter()
        .map(|(t, n)| (t.to_owned(), n))
        .collect();
        let sources = source_partitions(&counts, |t| t != "other", &changelog());
        assert_eq!(sources, vec![p("orders", 0), p("orders", 1), p("orders", 2)]);
    }

    #[test]
    fn standby_partitions_are_all_source_partitions_minus_the_assigned_ones() {
        let sources = vec![p("orders", 0), p("orders", 1), p("orders", 2), p("orders", 3), p("audit", 0)];
        let assigned = [p("orders", 1), p("orders", 3), p("elsewhere", 0)];
        let standby = standby_partitions(&sources, |q| assigned.contains(q));
        assert_eq!(standby, BTreeSet::from([p("audit", 0), p("orders", 0), p("orders", 2)]));
        assert!(standby_partitions(&sources, |_| true).is_empty(), "all assigned here: nothing to stand by for");
        assert_eq!(standby_partitions(&sources, |_| false).len(), sources.len());
    }
}
