//! A restore batch is bounded by bytes as well as by records
//! (`store.changelog.restore_batch_bytes`): records made large by long failure
//! reasons or keys cannot make one batch, and the memory of a restore, as large
//! as `restore_batch` of them.

use crate::harness;
use crate::scale::on;

use harness::changelog::{self, log_number};
use harness::logs::{log_lines, strip_ansi};
use harness::Scenario;

const RECORDS: usize = 2_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_batch_ends_at_its_byte_bound_before_its_record_count() {
    let Scenario { kafka, topic, receiver: _receiver, od, .. } = Scenario::new("restore-bytes", 1).await;
    let mut od = on(od);
    od.config.store_extra.push_str("restore_batch = 10000\nrestore_batch_bytes = \"4KiB\"\n");
    let changelog_topic = changelog::topic_for(&od.config.group_id, &topic);
    kafka.create_topic(&changelog_topic, 1, &[("cleanup.policy", "compact,delete")]).await;
    changelog::fill(&kafka, &changelog_topic, &topic, 0, RECORDS).await;

    od.start();
    od.wait_for_assignment().await;
    od.stop();
    let restored = log_lines(&od, "partition restored");
    let line = strip_ansi(restored.first().unwrap_or_else(|| panic!("no restore line:\n{}", od.log_tails(30, 0))));
    assert_eq!(log_number(&line, "read"), RECORDS as i64, "{line}");
    // Each record is well over 40 bytes of key and value: 4 KiB holds fewer than 100.
    let batches = log_number(&line, "batches");
    assert!(batches >= (RECORDS / 100) as i64, "{batches} batches for {RECORDS} records under a 4 KiB bound: {line}");
}
