//! The rest of the real pipeline for the end-to-end tests (the `debezium` tests):
//! PostgreSQL through `psql`, Kafka Connect's REST API, Debezium connector configs
//! derived from `debezium/connector.json`, `scripts/stack kill-connect|start-connect`,
//! and [`Scratch`], which removes the connectors, replication slots, publications and
//! tables a test creates (also when the test fails).
//!
//! Where things are: `OUTBOXD_TEST_PG` (default [`DEFAULT_PG`]), `OUTBOXD_TEST_CONNECT`
//! (default [`DEFAULT_CONNECT`]); the `psql` binary is `OUTBOXD_TEST_PSQL`, else
//! Debian's PostgreSQL 15 client (the one `scripts/stack` uses), else `psql` on the PATH.
//!
//! In files: [`pg`], [`connect`], [`scratch`], [`assertions`]; here, bounded commands,
//! `scripts/stack` and the stack's turn between test processes.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime};

use serde_json::{Map, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

use std::collections::{HashMap, HashSet};

use super::wait::{keep_looking, keep_looking_blocking};
use super::{new_event_id, wait_for, OffsetReader, Outboxd, Receiver};

mod assertions;
mod connect;
mod pg;
mod scratch;

pub use assertions::*;
pub use connect::*;
pub use pg::*;
pub use scratch::*;

pub const DEFAULT_PG: &str = "postgresql://postgres@127.0.0.1:15432/outbox";
pub const DEFAULT_CONNECT: &str = "http://127.0.0.1:18083";
/// The connector `scripts/stack up` registers from `debezium/connector.json`.
pub const MAIN_CONNECTOR: &str = "outbox-connector";
/// The table it captures.
pub const MAIN_TABLE: &str = "public.outbox";
/// What to do when the stack is not there.
pub const STACK_HINT: &str = "start the local stack with `scripts/stack up` (or point OUTBOXD_TEST_PG, \
                              OUTBOXD_TEST_CONNECT and OUTBOXD_TEST_BROKERS at a running one)";

/// Bound for one `psql` run or one statement batch of a session.
const PSQL_TIMEOUT: Duration = Duration::from_secs(60);
/// Bound for one REST request to Kafka Connect.
const REST_TIMEOUT: Duration = Duration::from_secs(30);
/// Bound for registering or deleting a connector (Connect answers 409 while it rebalances).
const CONNECTOR_CHANGE_TIMEOUT: Duration = Duration::from_secs(60);
/// Bound for a deleted connector's replication slot to become inactive.
const SLOT_RELEASE_TIMEOUT: Duration = Duration::from_secs(30);
/// Bound for `scripts/stack start-connect` (it waits for the connector itself).
pub const START_CONNECT_TIMEOUT: Duration = Duration::from_secs(240);

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).ok().filter(|s| !s.trim().is_empty()).unwrap_or_else(|| default.to_string())
}

/// A file of this repository.
pub fn repo_path(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

fn psql_program() -> PathBuf {
    if let Some(p) = std::env::var_os("OUTBOXD_TEST_PSQL").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    let debian = Path::new("/usr/lib/postgresql/15/bin/psql");
    if debian.exists() {
        debian.to_path_buf()
    } else {
        PathBuf::from("psql")
    }
}

/// What a bounded command run produced.
#[derive(Debug)]
pub struct RunOutput {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `cmd` with `stdin` as its input, killing it after `timeout`.
pub fn run_bounded(mut cmd: Command, stdin: Option<String>, timeout: Duration) -> Result<RunOutput, String> {
    cmd.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let shown = format!("{cmd:?}");
    let mut child = cmd.spawn().map_err(|e| format!("spawn {shown}: {e}"))?;
    if let Some(text) = stdin {
        let mut w = child.stdin.take().expect("stdin is piped");
        std::thread::spawn(move || {
            let _ = w.write_all(text.as_bytes());
        });
    }
    let mut out = child.stdout.take().expect("stdout is piped");
    let mut err = child.stderr.take().expect("stderr is piped");
    let t_out = std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = out.read_to_end(&mut b);
        b
    });
    let t_err = std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = err.read_to_end(&mut b);
        b
    });
    // Ok ends the wait: the child exited, or waiting for it failed.
    let exited = keep_looking_blocking(timeout, Duration::from_millis(10), || match child.try_wait() {
        Ok(Some(status)) => Ok(Ok(status)),
        Ok(None) => Err(()),
        Err(e) => Ok(Err(e)),
    });
    let status = match exited {
        Ok(Ok(status)) => status,
        Ok(Err(e)) => return Err(format!("wait for {shown}: {e}")),
        Err(()) => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("{shown} did not finish within {timeout:?} (killed it)"));
        }
    };
    let text = |b: Vec<u8>| String::from_utf8_lossy(&b).into_owned();
    Ok(RunOutput {
        status,
        stdout: text(t_out.join().unwrap_or_default()),
        stderr: text(t_err.join().unwrap_or_default()),
    })
}

/// The first `n` characters of `s`, for messages.
pub fn shorten(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        format!("{}… ({} characters)", s.chars().take(n).collect::<String>(), s.chars().count())
    }
}

/// An SQL string literal.
pub fn lit(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

// ---------------------------------------------------------------- scripts/stack

/// Runs `scripts/stack ARGS` (bounded); returns its stderr (the script logs there).
/// Fails the test when it fails.
pub fn stack_script(args: &[&str], timeout: Duration) -> String {
    let mut cmd = Command::new(repo_path("scripts/stack"));
    cmd.args(args);
    match run_bounded(cmd, None, timeout) {
        Ok(out) if out.status.success() => out.stderr,
        Ok(out) => panic!(
            "`scripts/stack {}` failed with {}\nstdout: {}\nstderr: {}",
            args.join(" "),
            out.status,
            out.stdout.trim(),
            out.stderr.trim()
        ),
        Err(e) => panic!("`scripts/stack {}`: {e}", args.join(" ")),
    }
}

/// SIGKILLs and restarts Kafka Connect through `scripts/stack` (the local stack
/// only). If the test fails between the two, dropping this restarts Connect, so that
/// the stack is left with Connect and [`MAIN_CONNECTOR`] running.
#[derive(Default)]
pub struct ConnectCrash {
    down: bool,
}

impl ConnectCrash {
    /// `scripts/stack kill-connect`
    pub fn kill(&mut self) {
        self.down = true;
        stack_script(&["kill-connect"], Duration::from_secs(60));
    }

    /// `scripts/stack start-connect` (waits until the connector runs); returns how long
    /// that took.
    pub fn start(&mut self) -> Duration {
        let t0 = Instant::now();
        stack_script(&["start-connect"], START_CONNECT_TIMEOUT);
        self.down = false;
        t0.elapsed()
    }
}

impl Drop for ConnectCrash {
    fn drop(&mut self) {
        if !self.down {
            return;
        }
        eprintln!("Kafka Connect was left killed: restarting it (scripts/stack start-connect)");
        let mut cmd = Command::new(repo_path("scripts/stack"));
        cmd.arg("start-connect");
        match run_bounded(cmd, None, START_CONNECT_TIMEOUT) {
            Ok(out) if out.status.success() => eprintln!("Kafka Connect restarted"),
            Ok(out) => eprintln!("scripts/stack start-connect failed with {}: {}", out.status, out.stderr.trim()),
            Err(e) => eprintln!("scripts/stack start-connect: {e}"),
        }
    }
}

// ---------------------------------------------------------------- one test process at a time

/// Default loopback port held by the test process whose turn it is (see [`StackTurn`]).
pub const TURN_PORT: u16 = 18089;

/// The stack (one Kafka Connect worker, fixed ports) is shared by every test process on
/// the machine, e.g. two `cargo test` runs from two work trees. While a process holds
/// this, it owns the stack's Connect worker: it is a listening socket on 127.0.0.1 port
/// `OUTBOXD_TEST_TURN_PORT` (default [`TURN_PORT`]), which the operating system frees
/// when the process ends, however it ends.
pub struct StackTurn {
    _listener: std::net::TcpListener,
}

impl StackTurn {
    /// Waits (up to `timeout`) until no other test process holds the turn.
    pub async fn take(timeout: Duration) -> StackTurn {
        let port: u16 = env_or("OUTBOXD_TEST_TURN_PORT", &TURN_PORT.to_string())
            .parse()
            .unwrap_or_else(|e| panic!("OUTBOXD_TEST_TURN_PORT: {e}"));
        let mut said = false;
        let taken = keep_looking(timeout, Duration::from_millis(250), async || {
            match std::net::TcpListener::bind(("127.0.0.1", port)) {
                Ok(listener) => Ok(listener),
                Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
                    if !said {
                        eprintln!(
                            "127.0.0.1:{port} is taken: waiting for another test process to finish with the stack"
                        );
                        said = true;
                    }
                    Err(())
                }
                Err(e) => panic!("bind 127.0.0.1:{port} (the test processes' turn): {e}"),
            }
        });
        let Ok(listener) = taken.await else {
            panic!(
                "127.0.0.1:{port} stayed taken for {timeout:?}: another test process is using the stack's \
                 Kafka Connect (or something else uses the port: set OUTBOXD_TEST_TURN_PORT)"
            );
        };
        StackTurn { _listener: listener }
    }
}
