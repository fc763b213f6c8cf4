//! A real OTLP/HTTP collector for the traces tests: the package's `outboxd-otlp-receiver`
//! as a child process on a free loopback port, stopped by its PID; the spans it wrote
//! (one JSON line each on its stdout), as [`Span`]s.

use std::io::{BufRead as _, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use serde::Deserialize;
use serde_json::{Map, Value};

const BIN: &str = env!("CARGO_BIN_EXE_outboxd-otlp-receiver");
/// How long the receiver may take to say where it listens.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// One exported span, as the receiver wrote it.
#[derive(Clone, Debug, Deserialize)]
pub struct Span {
    pub trace_id: String,
    pub span_id: String,
    /// Empty for a root span.
    pub parent_span_id: String,
    pub name: String,
    pub service: Value,
    pub attributes: Map<String, Value>,
    /// `code` 2 is an error (OTLP's `STATUS_CODE_ERROR`).
    pub status: Option<Status>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct Status {
    pub code: i32,
    pub message: String,
}

impl Span {
    pub fn attr(&self, key: &str) -> Option<&Value> {
        self.attributes.get(key)
    }
    pub fn attr_str(&self, key: &str) -> Option<&str> {
        self.attr(key).and_then(Value::as_str)
    }
    pub fn is_error(&self) -> bool {
        self.status.as_ref().is_some_and(|s| s.code == 2)
    }
}

/// The receiver process. Killed (by PID) when dropped.
pub struct OtlpReceiver {
    child: Child,
    addr: String,
    spans: Arc<Mutex<Vec<Span>>>,
}

impl OtlpReceiver {
    /// Starts it on `127.0.0.1:0` and waits until it says its address.
    pub fn start() -> OtlpReceiver {
        let mut child = Command::new(BIN)
            .arg("127.0.0.1:0")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start outboxd-otlp-receiver");
        let stdout = child.stdout.take().expect("piped stdout");
        let spans = Arc::new(Mutex::new(Vec::new()));
        let (listening, addr) = mpsc::channel();
        let collected = spans.clone();
        std::thread::Builder::new()
            .name("otlp-receiver-stdout".into())
            .spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { return };
                    let Ok(v) = serde_json::from_str::<Value>(&line) else { continue };
                    if let Some(a) = v.get("listening").and_then(Value::as_str) {
                        let _ = listening.send(a.to_owned());
                    } else if let Ok(span) = serde_json::from_value::<Span>(v) {
                        collected.lock().unwrap().push(span);
                    }
                }
            })
            .expect("spawn the reader");
        let addr = addr.recv_timeout(START_TIMEOUT).expect("outboxd-otlp-receiver says where it listens");
        OtlpReceiver { child, addr, spans }
    }

    /// The base URL for `[tracing.otlp] endpoint`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<Span> {
        self.spans.lock().unwrap().clone()
    }

    /// Spans of one trace.
    pub fn trace(&self, trace_id: &str) -> Vec<Span> {
        self.spans().into_iter().filter(|s| s.trace_id == trace_id).collect()
    }

    /// Stops it (SIGKILL to its PID) and reaps it.
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        self.stop();
    }
}
