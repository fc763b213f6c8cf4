//! The contender processes (start, stop, the log lines the clocks start on) and
//! what /proc and outboxd's metrics endpoint say about them and about the machine.

use std::collections::VecDeque;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use tokio::io::AsyncBufReadExt;

pub(crate) struct ChildProc {
    name: &'static str,
    child: tokio::process::Child,
    pid: i32,
    pub(crate) spawned: Instant,
    pub(crate) marks: Arc<Mutex<Marks>>,
}

#[derive(Default)]
pub(crate) struct Marks {
    pub(crate) running: Option<Instant>,
    pub(crate) assigned: Option<Instant>,
    pub(crate) handled: Option<Instant>,
    /// outboxd's "partition restored" line (the first one) and when it came.
    pub(crate) restored: Option<Instant>,
    pub(crate) restored_line: Option<String>,
    /// outboxd's first "standby caught up" line (`store.changelog.standby`).
    pub(crate) standby_caught_up: Option<Instant>,
    tail: VecDeque<String>,
}

impl ChildProc {
    pub(crate) fn spawn(mut cmd: tokio::process::Command, name: &'static str) -> anyhow::Result<ChildProc> {
        cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped()).kill_on_drop(true);
        let spawned = Instant::now();
        let mut child = cmd.spawn().with_context(|| format!("starting {name}"))?;
        let pid = child.id().context("child pid")? as i32;
        let marks: Arc<Mutex<Marks>> = Arc::default();
        let stderr = child.stderr.take().context("stderr")?;
        let m = marks.clone();
        tokio::spawn(async move {
            let mut lines = tokio::io::BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let now = Instant::now();
                let mut m = m.lock().unwrap();
                if line.contains("outboxd running") {
                    m.running.get_or_insert(now);
                }
                if line.contains("partitions assigned") {
                    m.assigned.get_or_insert(now);
                }
                if line.contains("event handled") {
                    m.handled.get_or_insert(now);
                }
                if line.contains("standby caught up") {
                    m.standby_caught_up.get_or_insert(now);
                }
                if line.contains("partition restored") && m.restored.is_none() {
                    m.restored = Some(now);
                    m.restored_line = Some(line.clone());
                }
                if m.tail.len() >= 40 {
                    m.tail.pop_front();
                }
                m.tail.push_back(line);
            }
        });
        Ok(ChildProc { name, child, pid, spawned, marks })
    }

    fn tail(&self) -> String {
        self.marks.lock().unwrap().tail.iter().cloned().collect::<Vec<_>>().join("\n")
    }

    pub(crate) fn check_alive(&mut self) -> anyhow::Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!("{} exited early ({status}); its last stderr lines:\n{}", self.name, self.tail());
        }
        Ok(())
    }

    pub(crate) async fn wait_mark(
        &mut self,
        pick: fn(&Marks) -> Option<Instant>,
        what: &str,
        timeout: Duration,
    ) -> anyhow::Result<Instant> {
        let t0 = Instant::now();
        loop {
            if let Some(t) = pick(&self.marks.lock().unwrap()) {
                return Ok(t);
            }
            self.check_alive()?;
            if t0.elapsed() > timeout {
                bail!("{}: no '{what}' after {timeout:?}; last stderr lines:\n{}", self.name, self.tail());
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    pub(crate) async fn wait_assigned(&mut self) -> anyhow::Result<Instant> {
        self.wait_mark(|m| m.assigned, "partitions assigned", Duration::from_secs(90)).await
    }

    /// CPU seconds (user + system) so far.
    pub(crate) fn cpu_secs(&self, clk: f64) -> f64 {
        proc_cpu_ticks(self.pid, false).map(|t| t as f64 / clk).unwrap_or(f64::NAN)
    }

    /// (VmRSS, VmHWM) in bytes.
    pub(crate) fn rss(&self) -> (u64, u64) {
        proc_rss(self.pid)
    }

    /// SIGKILL at once (a crash); returns when it was sent.
    pub(crate) async fn kill(mut self) -> anyhow::Result<Instant> {
        let at = Instant::now();
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid), nix::sys::signal::Signal::SIGKILL)?;
        self.child.wait().await?;
        Ok(at)
    }

    /// SIGTERM, then SIGKILL after `grace`.
    pub(crate) async fn stop(mut self, grace: Duration) -> anyhow::Result<()> {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid), nix::sys::signal::Signal::SIGTERM);
        match tokio::time::timeout(grace, self.child.wait()).await {
            Ok(status) => {
                let status = status?;
                if !status.success() {
                    eprintln!("bench: {} exited with {status}; last lines:\n{}", self.name, self.tail());
                }
            }
            Err(_) => {
                eprintln!("bench: {} (pid {}) did not stop within {grace:?}: SIGKILL", self.name, self.pid);
                self.child.kill().await?;
            }
        }
        Ok(())
    }
}

fn proc_cpu_ticks(pid: i32, with_children: bool) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // Fields from 3 (state): utime = 14, stime = 15, cutime = 16, cstime = 17.
    let n = |i: usize| f.get(i - 3).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    Some(n(14) + n(15) + if with_children { n(16) + n(17) } else { 0 })
}

fn proc_rss(pid: i32) -> (u64, u64) {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kb = |key: &str| {
        s.lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
            * 1024
    };
    (kb("VmRSS:"), kb("VmHWM:"))
}

/// CPU seconds (user + system) of the children this process has waited for.
pub(crate) fn rusage_children_secs() -> f64 {
    nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_CHILDREN)
        .map(|u| {
            let t = |tv: nix::sys::time::TimeVal| tv.tv_sec() as f64 + tv.tv_usec() as f64 / 1e6;
            t(u.user_time()) + t(u.system_time())
        })
        .unwrap_or(f64::NAN)
}

/// CPU ticks of every PostgreSQL server process (backends that exited are in the
/// postmaster's cutime), so a difference covers the pg-table contender's server side.
pub(crate) fn pg_server_ticks() -> u64 {
    let mut sum = 0;
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for e in dir.flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else { continue };
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            if comm.trim() == "postgres" {
                sum += proc_cpu_ticks(pid, true).unwrap_or(0);
            }
        }
    }
    sum
}

/// CPU used on the machine by processes that are not part of the benchmark
/// (not the driver, its children, the Kafka broker or PostgreSQL): other work
/// sharing the 2 cores makes every number worse and noisier.
#[derive(Clone, Copy)]
pub(crate) struct Noise {
    busy: u64,
    ours: u64,
    at: Instant,
}

impl Noise {
    pub(crate) fn now() -> Noise {
        let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
        let busy = stat
            .lines()
            .next()
            .map(|l| {
                let f: Vec<u64> = l.split_whitespace().skip(1).filter_map(|v| v.parse().ok()).collect();
                // user nice system idle iowait irq softirq steal
                [0, 1, 2, 5, 6, 7].iter().filter_map(|&i| f.get(i)).sum()
            })
            .unwrap_or(0);
        let ru = |who| {
            nix::sys::resource::getrusage(who)
                .map(|u| {
                    let t = |tv: nix::sys::time::TimeVal| tv.tv_sec() as f64 + tv.tv_usec() as f64 / 1e6;
                    t(u.user_time()) + t(u.system_time())
                })
                .unwrap_or(0.0)
        };
        let own = ru(nix::sys::resource::UsageWho::RUSAGE_SELF) + ru(nix::sys::resource::UsageWho::RUSAGE_CHILDREN);
        // Children still running are not in RUSAGE_CHILDREN yet: add them.
        let mut ours = (own * CLK_GUESS) as u64 + pg_server_ticks() + broker_ticks();
        if let Ok(dir) = std::fs::read_dir("/proc") {
            let me = std::process::id().to_string();
            for e in dir.flatten() {
                let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else { continue };
                let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
                if let Some(rest) = stat.rfind(')').map(|i| &stat[i + 2..]) {
                    if rest.split_whitespace().nth(1) == Some(me.as_str()) {
                        ours += proc_cpu_ticks(pid, true).unwrap_or(0);
                    }
                }
            }
        }
        Noise { busy, ours, at: Instant::now() }
    }

    /// Fraction of the machine (all cores) used by other processes since `self`.
    pub(crate) fn other_share(&self) -> f64 {
        let now = Noise::now();
        let secs = (now.at - self.at).as_secs_f64();
        let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1) as f64;
        let other = now.busy.saturating_sub(self.busy) as f64 - now.ours.saturating_sub(self.ours) as f64;
        (other / CLK_GUESS / (secs * cores)).max(0.0)
    }
}

/// USER_HZ: /proc/stat and /proc/PID/stat count in these ticks (100 on Linux).
const CLK_GUESS: f64 = 100.0;

fn broker_ticks() -> u64 {
    let mut sum = 0;
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for e in dir.flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else { continue };
            let cmd = std::fs::read_to_string(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            if cmd.contains("kafka.Kafka") {
                sum += proc_cpu_ticks(pid, true).unwrap_or(0);
            }
        }
    }
    sum
}

/// outboxd's `/metrics` page (Prometheus text) from its admin port.
pub(crate) async fn metrics_text(port: u16) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok()?;
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").await.ok()?;
    let mut text = String::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_string(&mut text)).await.ok()?.ok()?;
    Some(text)
}

/// Every series of metric `name` in a `/metrics` page: (labels as written, e.g.
/// `{topic="t"}` or empty, value).
pub(crate) fn metric_series(text: &str, name: &str) -> Vec<(String, f64)> {
    text.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            Some((series[name.len()..].trim().to_owned(), value.parse().ok()?))
        })
        .collect()
}

/// outboxd's group-commit figures from its Prometheus endpoint: (commits, mean
/// records per commit, mean flush+fdatasync ms).
pub(crate) async fn sync_metrics(port: u16) -> Option<(f64, f64, f64)> {
    let text = metrics_text(port).await?;
    let val = |name: &str| metric_series(&text, name).first().map(|s| s.1);
    let commits = val("outboxd_store_sync_seconds_count")?;
    let sync_sum = val("outboxd_store_sync_seconds_sum")?;
    let batch_sum = val("outboxd_store_commit_batch_records_sum")?;
    Some((commits, batch_sum / commits.max(1.0), sync_sum / commits.max(1.0) * 1000.0))
}
