//! The Apache Camel contenders: Camel's Idempotent Consumer (Camel 4.22, camel-kafka,
//! camel-http; the Maven project in `bench/camel/`, built by `bench/run`) in front of
//! the same HTTP call outboxd's http handler makes, so readers can compare outboxd
//! with what a Camel user would deploy for the same outbox topic.
//!
//! The driver writes the route's settings (brokers, the group it watches, the topics,
//! the receiver, the mode) to a properties file and starts `java -jar` on it with the
//! JVM's default heap; RSS and CPU are the JVM process's, read from /proc as for the
//! other contenders. The route prints `partitions assigned: N` once its consumers hold
//! every partition (the clock starts there, as for outboxd) and exits on SIGTERM.
//!
//! Concurrency, as a Camel user would set it: `consumersCount` = the 8 partitions, one
//! consumer thread per partition, one exchange (one HTTP call) at a time per consumer.
//! No asynchronous EIP (threads, parallel multicast): the manual commit has to run on
//! the consumer's own thread.
//!
//! - `camel`: the documented at-least-once recipe: `KafkaIdempotentRepository` on a
//!   fresh topic of its own, its cache (`maxCacheSize`) sized for every id of the run,
//!   `eager=false`, `completionEager=true`, `allowManualCommit=true`,
//!   `autoCommitEnable=false`, `breakOnFirstError=true`, the offset committed through
//!   `KafkaManualCommit` after the call.
//! - `camel-defaults`: the same route with Camel's defaults for the idempotent consumer
//!   (`eager=true`), the repository (1000 ids cached) and the consumer (auto commit
//!   every 5 s, no break on error).
//! - `camel-memory`: the recipe with `MemoryIdempotentRepository` (sized for every id)
//!   instead of the Kafka one (only with `--contenders`).
//!
//! Every mode sets `autoOffsetReset=earliest`: the group is new and has a backlog to read.

use anyhow::Context;

use crate::bench::{Bench, Contender};
use crate::procs::ChildProc;
use crate::PARTITIONS;

/// Consumers of the route (`consumersCount`): one per partition.
pub(crate) const CONSUMERS: usize = PARTITIONS as usize;

/// Starts the Camel route `who` on `topics` for consumer group `group`; `ids` = how many
/// distinct event ids the run can bring (the recipe's cache holds them all);
/// `session_timeout_ms`: the consumers' `session.timeout.ms` when not the Kafka client's default.
pub(crate) async fn spawn(
    b: &Bench,
    who: Contender,
    name: &str,
    group: &str,
    topics: &[String],
    ids: u64,
    session_timeout_ms: Option<u64>,
) -> anyhow::Result<ChildProc> {
    let jar = std::path::absolute(&b.args.camel_jar)?;
    anyhow::ensure!(
        jar.exists(),
        "{} missing: build it with `mvn -f bench/camel/pom.xml package` (bench/run does)",
        jar.display()
    );
    let repository = b.topic(&format!("camel-ids.{name}"));
    if who != Contender::CamelMemory {
        b.create_topic(&repository, 1).await?;
    }
    let settings = b.work.join("configs").join(format!("{name}.properties"));
    let text = settings_text(b, who, group, topics, &repository, ids, session_timeout_ms);
    std::fs::write(&settings, text).with_context(|| format!("writing {}", settings.display()))?;
    let mut cmd = tokio::process::Command::new("java");
    cmd.arg("-jar").arg(&jar).arg(&settings).current_dir(&b.work);
    ChildProc::spawn(cmd, who.name())
}

/// The route's properties file (see bench/camel's `Main`).
fn settings_text(
    b: &Bench,
    who: Contender,
    group: &str,
    topics: &[String],
    repository: &str,
    ids: u64,
    session_timeout_ms: Option<u64>,
) -> String {
    let mut text = format!(
        "mode={mode}\nbrokers={brokers}\ngroup={group}\ntopics={topics}\nreceiver=http://127.0.0.1:{port}\n\
         partitions={partitions}\nconsumers={CONSUMERS}\nrepository.topic={repository}\nrepository.cache={ids}\n",
        mode = who.name(),
        brokers = b.args.brokers,
        topics = topics.join(","),
        port = b.recv_port,
        partitions = PARTITIONS as usize * topics.len(),
    );
    if let Some(ms) = session_timeout_ms {
        text.push_str(&format!("session.timeout.ms={ms}\n"));
    }
    text
}
