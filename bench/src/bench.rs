//! The contenders, the config each runs with, and [`Bench`]: what every scenario
//! shares (arguments, scratch directory, receiver, broker admin, the topics to
//! delete at the end).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::RDKafkaErrorCode;

use crate::procs::ChildProc;
use crate::receiver::Recv;
use crate::{Args, Sizes};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Contender {
    Naive,
    /// naive with one changelog record per event awaited before its offset
    /// (`naive --changelog`): the floor of outboxd's design.
    NaiveChangelog,
    PgTable,
    Outboxd,
    Relaxed,
    OutboxdW0,
    RelaxedW0,
    /// outboxd with `[store.changelog] enabled = false` (drain: what the changelog costs).
    NoChangelog,
    /// outboxd with `on_uncertain = "park"`: every claim written, durable and in the
    /// changelog before the call (what a durable claim costs).
    Park,
    /// Apache Camel's Idempotent Consumer (bench/camel, see `camel.rs`): the at-least-once recipe.
    Camel,
    /// The same Camel route with Camel's defaults (eager, 1000 ids cached, auto commit).
    CamelDefaults,
    /// The Camel recipe with the in-memory repository instead of the Kafka one.
    CamelMemory,
}

/// The default four are in `--contenders`; also selectable with --contenders (investigation): outboxd with `store.commit_interval = "0ms"`.
pub(crate) const ALL: [Contender; 12] = [
    Contender::Naive,
    Contender::NaiveChangelog,
    Contender::PgTable,
    Contender::Outboxd,
    Contender::NoChangelog,
    Contender::Park,
    Contender::Relaxed,
    Contender::OutboxdW0,
    Contender::RelaxedW0,
    Contender::Camel,
    Contender::CamelDefaults,
    Contender::CamelMemory,
];

impl Contender {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Contender::Naive => "naive",
            Contender::NaiveChangelog => "naive-changelog",
            Contender::PgTable => "pg-table",
            Contender::Outboxd => "outboxd",
            Contender::Relaxed => "outboxd-relaxed",
            Contender::OutboxdW0 => "outboxd-window0",
            Contender::RelaxedW0 => "outboxd-relaxed-window0",
            Contender::NoChangelog => "outboxd-nochangelog",
            Contender::Park => "outboxd-park",
            Contender::Camel => "camel",
            Contender::CamelDefaults => "camel-defaults",
            Contender::CamelMemory => "camel-memory",
        }
    }
    pub(crate) fn fsync(self) -> bool {
        !matches!(self, Contender::Relaxed | Contender::RelaxedW0)
    }
    /// `store.commit_interval` when not the shipped default.
    pub(crate) fn window(self) -> Option<&'static str> {
        matches!(self, Contender::OutboxdW0 | Contender::RelaxedW0).then_some("0ms")
    }
    /// The outboxd binary (not a contender of bench/).
    pub(crate) fn is_outboxd(self) -> bool {
        !matches!(self, Contender::Naive | Contender::NaiveChangelog | Contender::PgTable) && !self.is_camel()
    }
    /// A Camel route (a JVM, started by `camel::spawn`), not a binary of this workspace.
    pub(crate) fn is_camel(self) -> bool {
        matches!(self, Contender::Camel | Contender::CamelDefaults | Contender::CamelMemory)
    }
    /// What goes into `[store]` besides the common settings.
    pub(crate) fn store_extra(self) -> &'static str {
        match self {
            Contender::NoChangelog => "[store.changelog]\nenabled = false\n",
            _ => "",
        }
    }
    /// What goes into the `[[handlers]]` entry besides the common settings.
    pub(crate) fn handler_settings(self) -> &'static str {
        match self {
            Contender::Park => "on_uncertain = \"park\"\n",
            _ => "",
        }
    }
}

/// The changelog key every outboxd of a run signs its changelog records with, as
/// docs/security.md asks of a deployment: the measured cost includes the MAC.
pub(crate) const CHANGELOG_KEY: &str = "bench-changelog-key-0123456789abcdef0123456789";

/// `[store]`'s extra settings with the changelog key added, unless the changelog is off.
fn signed(extra: &str) -> String {
    if extra.contains("enabled = false") {
        return extra.to_owned();
    }
    let key = format!("key = {CHANGELOG_KEY:?}\n");
    match extra.contains("[store.changelog]") {
        // The extra settings end inside that table.
        true => format!("{extra}{key}"),
        false => format!("{extra}[store.changelog]\n{key}"),
    }
}

/// Rotates the contender order per run so no contender always goes first.
pub(crate) fn order(rep: usize, only: &str) -> Vec<Contender> {
    let mut v: Vec<Contender> = ALL.iter().copied().filter(|c| only.split(',').any(|o| o.trim() == c.name())).collect();
    let n = v.len();
    if n > 0 {
        v.rotate_left(rep % n);
    }
    v
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Hk {
    Log,
    Http,
}

impl Hk {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Hk::Log => "log",
            Hk::Http => "http",
        }
    }
}

pub(crate) struct Cfg<'a> {
    pub(crate) name: String,
    pub(crate) group: String,
    pub(crate) topics: Vec<String>,
    pub(crate) handler: Hk,
    pub(crate) fsync: bool,
    pub(crate) max_in_flight: usize,
    /// `store.commit_interval`; None = the shipped default.
    pub(crate) commit_window: Option<&'a str>,
    pub(crate) retention: &'a str,
    pub(crate) gc_interval: &'a str,
    pub(crate) drain_timeout: &'a str,
    /// TOML after the `[store]` settings (e.g. a `[store.changelog]` table).
    pub(crate) store_extra: String,
    /// librdkafka properties of this config only (after `--kafka-option`).
    pub(crate) kafka_extra: Vec<(&'a str, String)>,
    /// TOML appended to the `[[handlers]]` entry (e.g. `[handlers.retry]`); its
    /// tables belong to that entry, the last one of the file.
    pub(crate) handler_extra: String,
}

pub(crate) struct Bench {
    pub(crate) args: Args,
    pub(crate) sizes: Sizes,
    pub(crate) run_id: String,
    pub(crate) work: PathBuf,
    pub(crate) bin: PathBuf,
    pub(crate) recv: Arc<Recv>,
    pub(crate) recv_port: u16,
    pub(crate) admin: AdminClient<DefaultClientContext>,
    /// What the suite created, deleted at its end.
    pub(crate) topics: Topics,
    pub(crate) clk_tck: f64,
}

/// The topics a suite created, each named once however often a scenario created it
/// again: a DeleteTopics request that names a topic twice gets one answer row for it,
/// and rdkafka then reads a missing row of the result (a crash at the suite's end).
#[derive(Default)]
pub(crate) struct Topics(Mutex<std::collections::BTreeSet<String>>);

impl Topics {
    pub(crate) fn add(&self, name: impl Into<String>) {
        self.0.lock().unwrap().insert(name.into());
    }

    /// Every topic added, once each.
    pub(crate) fn all(&self) -> Vec<String> {
        self.0.lock().unwrap().iter().cloned().collect()
    }
}

impl Bench {
    pub(crate) fn write_config(&self, c: &Cfg) -> anyhow::Result<(PathBuf, u16)> {
        let admin_port = free_port()?;
        let handler = match c.handler {
            Hk::Log => "kind = \"log\"\n".to_owned(),
            Hk::Http => format!(
                "kind = \"http\"\nurl = \"http://127.0.0.1:{}/e/{{aggregate_id}}\"\ntimeout = \"30s\"\n",
                self.recv_port
            ),
        };
        let topics = c.topics.iter().map(|t| format!("{t:?}")).collect::<Vec<_>>().join(", ");
        let mut options = String::new();
        for kv in &self.args.kafka_options {
            let (k, v) = kv.split_once('=').context("--kafka-option KEY=VALUE")?;
            options.push_str(&format!("{k:?} = {v:?}\n"));
        }
        for (k, v) in &c.kafka_extra {
            options.push_str(&format!("{k:?} = {v:?}\n"));
        }
        let text = format!(
            "[kafka]\nbrokers = {brokers:?}\ngroup_id = {group:?}\ncommit_interval = \"100ms\"\ndrain_timeout = {dt:?}\n[kafka.options]\n{options}\n\
             [store]\npath = {path:?}\nretention = {ret:?}\n{window}max_in_flight = {mif}\ngc_interval = {gc:?}\nfsync = {fsync}\n{extra}\n\
             [admin]\nlisten = \"127.0.0.1:{admin}\"\n\n\
             [[handlers]]\ntopics = [{topics}]\n{handler}{handler_extra}",
            // The admin server (metrics) stays on, as shipped, on a free port.
            admin = admin_port,
            brokers = self.args.brokers,
            group = c.group,
            dt = c.drain_timeout,
            // Relative to the working directory of the child (the work dir).
            path = format!("stores/{}", c.name),
            ret = c.retention,
            window = c.commit_window.map(|w| format!("commit_interval = {w:?}\n")).unwrap_or_default(),
            mif = c.max_in_flight,
            gc = c.gc_interval,
            fsync = c.fsync,
            extra = signed(&c.store_extra),
            handler_extra = c.handler_extra,
        );
        let file = self.work.join("configs").join(format!("{}.toml", c.name));
        std::fs::write(&file, text)?;
        let store = self.work.join("stores").join(&c.name);
        if store.exists() {
            std::fs::remove_dir_all(&store)?;
        }
        Ok((file, admin_port))
    }

    pub(crate) fn spawn(&self, who: Contender, config: &Path, table: &str, log: &str) -> anyhow::Result<ChildProc> {
        let mut cmd = match who {
            Contender::Naive => {
                let mut c = tokio::process::Command::new(self.bin.join("naive"));
                c.arg("--config").arg(config);
                c
            }
            Contender::NaiveChangelog => {
                let mut c = tokio::process::Command::new(self.bin.join("naive"));
                c.arg("--config").arg(config).arg("--changelog");
                c
            }
            Contender::PgTable => {
                let mut c = tokio::process::Command::new(self.bin.join("pg-table"));
                c.arg("--config").arg(config).args(["--pg", &self.args.pg, "--table", table, "--pool", "32"]);
                c
            }
            _ => {
                let mut c = tokio::process::Command::new(self.bin.join("outboxd"));
                c.arg("run").arg("--config").arg(config);
                c
            }
        };
        cmd.current_dir(&self.work).env("OUTBOXD_LOG", log);
        if who.is_outboxd() {
            for kv in &self.args.outboxd_env {
                let (k, v) = kv.split_once('=').context("--outboxd-env KEY=VALUE")?;
                cmd.env(k, v);
            }
        }
        ChildProc::spawn(cmd, who.name())
    }

    pub(crate) async fn create_topic(&self, name: &str, partitions: i32) -> anyhow::Result<()> {
        let t = NewTopic::new(name, partitions, TopicReplication::Fixed(1));
        let res = self
            .admin
            .create_topics([&t], &AdminOptions::new().operation_timeout(Some(Duration::from_secs(30))))
            .await?;
        for r in res {
            if let Err((topic, code)) = r {
                if code != RDKafkaErrorCode::TopicAlreadyExists {
                    bail!("creating topic {topic}: {code}");
                }
            }
        }
        self.topics.add(name);
        // Wait until the broker serves metadata for every partition.
        let probe: BaseConsumer = client(&self.args.brokers, None).create()?;
        for _ in 0..100 {
            if let Ok(md) = probe.fetch_metadata(Some(name), Duration::from_secs(5)) {
                if md
                    .topics()
                    .first()
                    .is_some_and(|t| t.partitions().len() == partitions as usize && t.error().is_none())
                {
                    return Ok(());
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        bail!("topic {name} did not become ready")
    }

    pub(crate) fn topic(&self, what: &str) -> String {
        format!("bench.{}.{what}", self.run_id)
    }
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

pub(crate) fn client(brokers: &str, group: Option<&str>) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", brokers);
    if let Some(g) = group {
        c.set("group.id", g).set("enable.auto.commit", "false");
    }
    c
}

#[cfg(test)]
mod tests {
    use super::Topics;

    /// The crash scenario creates its Camel repository topic at every restart: the
    /// clean-up must still name it once (a repeated name crashed the driver at exit).
    #[test]
    fn a_topic_created_again_is_deleted_once() {
        let topics = Topics::default();
        for name in ["camel-ids", "source", "camel-ids", "camel-ids", "changelog"] {
            topics.add(name);
        }
        assert_eq!(topics.all(), ["camel-ids", "changelog", "source"]);
    }
}
