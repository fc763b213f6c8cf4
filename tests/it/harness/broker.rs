//! A private Kafka broker for tests that SIGKILL the broker: `scripts/stack` with its
//! own state folder (a temporary directory) and its own free ports, so the shared
//! broker that the other tests use stays up. Stopped with `scripts/stack down kafka`
//! when dropped.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use super::ports::child_port;
use super::wait::keep_looking_blocking;

/// `scripts/stack up kafka` may download jars on a cold machine and waits for
/// readiness itself (bounded by OUTBOXD_STACK_TIMEOUT); this bounds the whole call.
const STACK_CALL_TIMEOUT: Duration = Duration::from_secs(240);

pub struct PrivateBroker {
    dir: tempfile::TempDir,
    port: u16,
    controller_port: u16,
}

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts").join("stack")
}

impl PrivateBroker {
    /// Starts a new single-node KRaft broker on two free ports of 127.0.0.1.
    pub fn start() -> PrivateBroker {
        let dir = tempfile::Builder::new().prefix("outboxd-private-kafka-").tempdir().expect("temp dir");
        let (port, controller_port) = (child_port(), child_port());
        let b = PrivateBroker { dir, port, controller_port };
        b.stack(&["up", "kafka"]);
        assert!(b.port_open(), "the private broker does not listen on {} after `scripts/stack up kafka`", b.brokers());
        b
    }

    pub fn brokers(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Runs `scripts/stack ARGS` with this broker's folder and ports; fails the test
    /// when it fails or takes longer than a bound.
    fn stack(&self, args: &[&str]) {
        let out_path = self.dir.path().join("stack-call.log");
        let out = std::fs::File::create(&out_path).expect("stack log");
        let mut child = Command::new("bash")
            .arg(script())
            .args(args)
            .env("OUTBOXD_STACK_DIR", self.dir.path())
            .env("OUTBOXD_KAFKA_PORT", self.port.to_string())
            .env("OUTBOXD_CONTROLLER_PORT", self.controller_port.to_string())
            .env("OUTBOXD_STACK_TIMEOUT", "150")
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("dup"))
            .stderr(out)
            .spawn()
            .expect("run scripts/stack");
        let exited = keep_looking_blocking(STACK_CALL_TIMEOUT, Duration::from_millis(50), || {
            child.try_wait().expect("try_wait").ok_or(())
        });
        let Ok(status) = exited else {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "`scripts/stack {}` (private broker) did not finish within {STACK_CALL_TIMEOUT:?}:\n{}",
                args.join(" "),
                std::fs::read_to_string(&out_path).unwrap_or_default()
            );
        };
        assert!(
            status.success(),
            "`scripts/stack {}` (private broker) failed with {status}:\n{}",
            args.join(" "),
            std::fs::read_to_string(&out_path).unwrap_or_default()
        );
    }

    /// The broker's pid while it runs (from the pid file `scripts/stack` keeps).
    pub fn pid(&self) -> Option<u32> {
        let text = std::fs::read_to_string(self.dir.path().join("kafka").join("kafka.pid")).ok()?;
        let pid: u32 = text.trim().parse().ok()?;
        (!gone(pid)).then_some(pid)
    }

    pub fn port_open(&self) -> bool {
        std::net::TcpStream::connect_timeout(&([127, 0, 0, 1], self.port).into(), Duration::from_millis(500)).is_ok()
    }

    /// SIGKILL the broker (`scripts/stack kill-kafka`), and check it is gone.
    pub fn kill(&self) {
        let pid = self.pid().expect("the private broker is not running");
        self.stack(&["kill-kafka"]);
        assert!(gone(pid), "broker pid {pid} still runs after kill-kafka");
        // The JVM's other threads (and its sockets) may outlive the main thread briefly.
        let closed = keep_looking_blocking(Duration::from_secs(10), Duration::from_millis(50), || {
            if self.port_open() {
                Err(())
            } else {
                Ok(())
            }
        });
        assert!(closed.is_ok(), "the broker port {} still accepts connections 10 s after kill-kafka", self.port);
    }

    /// Starts it again on the same data (`scripts/stack up kafka`).
    pub fn restart(&self) {
        self.stack(&["up", "kafka"]);
    }
}

impl Drop for PrivateBroker {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(script())
            .args(["down", "kafka"])
            .env("OUTBOXD_STACK_DIR", self.dir.path())
            .env("OUTBOXD_KAFKA_PORT", self.port.to_string())
            .env("OUTBOXD_CONTROLLER_PORT", self.controller_port.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// Whether the process is gone (no longer exists, or a zombie waiting to be reaped).
pub fn gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => {
            stat.rsplit(')').next().and_then(|r| r.split_whitespace().next()).is_some_and(|s| s == "Z" || s == "X")
        }
    }
}
