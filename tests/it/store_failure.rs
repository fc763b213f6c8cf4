//! A store that fails while outboxd runs stops the service with that failure,
//! whatever path saw it: the handling of an event (`faults::disk_full`: the store's
//! filesystem fills up under load) or the restore of a partition from its
//! changelog (here). After a failed write or sync the store answers every later
//! durable wait with the same error, so trying again could only spin: the process
//! exits non-zero naming the store and the cause, and handles nothing meanwhile.

use crate::harness;
use crate::scale::on;

use std::time::Duration;

use harness::changelog;
use harness::logs::{log_lines, strip_ansi};
use harness::tmpfs::Tmpfs;
use harness::Scenario;

/// Changelog records to restore: several times what the store's filesystem holds.
const RECORDS: usize = 60_000;
/// The store's filesystem: enough to open the store, far too small for the restore.
const TMPFS_SIZE: &str = "3m";
/// How long the service may take to notice and stop.
const STOP_BOUND: Duration = Duration::from_secs(90);

/// The store's filesystem fills up during a restore: the service stops with the
/// store's error and a non-zero exit instead of trying the restore again from its
/// checkpoint every few seconds while the partition stays paused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_failure_during_a_restore_stops_the_service_with_the_error() {
    let _load = harness::turns::LOAD.lock().await;
    let tmpfs = Tmpfs::mount(TMPFS_SIZE);
    let Scenario { kafka, topic, receiver, od, .. } = Scenario::new("store-fails-in-restore", 1).await;
    let mut od = on(od);
    od.config.store_path = tmpfs.path().join("store");
    let changelog_topic = changelog::topic_for(&od.config.group_id, &topic);
    kafka.create_topic(&changelog_topic, 1, &[("cleanup.policy", "compact,delete")]).await;
    changelog::fill(&kafka, &changelog_topic, &topic, 0, RECORDS).await;

    od.start();
    let pid = od.pid();
    let stopped = harness::wait_at_most(STOP_BOUND, harness::POLL_EVERY, || harness::broker::gone(pid)).await;
    assert!(
        stopped,
        "outboxd still runs {STOP_BOUND:?} after its restore met a full store; its last restore lines: {:?}",
        log_lines(&od, "restore").iter().rev().take(4).collect::<Vec<_>>()
    );
    let status = od.terminate();
    let log = strip_ansi(&od.log());
    assert!(
        log.lines().any(|l| l.contains("restoring the partition from its changelog")),
        "the premise: the restore began\n{}",
        od.log_tails(40, 0)
    );
    assert!(!status.success(), "outboxd must exit non-zero when its store fails during a restore; got {status}");
    let error_line = log.lines().rev().find(|l| l.starts_with("error:")).unwrap_or("").to_string();
    assert!(
        error_line.contains("store") && (error_line.contains("No space left") || error_line.contains("os error 28")),
        "the exit message should name the store and the cause; got {error_line:?}\n{}",
        od.log_tails(40, 0)
    );
    assert!(
        log.lines().any(|l| l.contains("store failed during the restore")),
        "the restore says the store failed\n{}",
        od.log_tails(40, 0)
    );
    assert!(
        !log.lines().any(|l| l.contains("restore failed; trying again")),
        "a store failure is not retried as if the brokers were away\n{}",
        od.log_tails(40, 0)
    );
    assert!(!log.lines().any(|l| l.contains("partition restored")), "nothing is restored on a full store");
    assert_eq!(receiver.calls().len(), 0, "nothing was handled");
}
