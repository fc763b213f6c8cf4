//! Spans on their way to the collector: a bounded queue that a span's end never waits
//! on (full: the span is dropped and counted), and one task on the runtime that sends
//! them in batches, each export bounded by `tracing.otlp.timeout`. A failed export
//! drops its batch (counted): spans are diagnostics, and holding them for a collector
//! that is away would only move the loss to memory. The log says so once when exports
//! start failing, then at most once per [`REPORT_EVERY`] with the count, and once
//! when they work again.

use std::time::{Duration, Instant};

use opentelemetry::Context;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{Span, SpanData, SpanExporter, SpanProcessor};
use opentelemetry_sdk::Resource;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::config::OtlpConfig;
use crate::metrics::names;

/// Spans per export request: OTLP collectors accept far more, and 512 spans (about
/// 85 events) keep one request well under a megabyte.
const MAX_BATCH: usize = 512;
/// How long a span may wait for a batch to fill before it is sent anyway.
const EXPORT_EVERY: Duration = Duration::from_secs(1);
/// While exports fail, the log repeats the count of dropped spans at most this often.
const REPORT_EVERY: Duration = Duration::from_secs(60);

/// Ends spans into the queue (the provider's processor).
#[derive(Debug)]
pub(super) struct Processor {
    queue: mpsc::Sender<SpanData>,
    stop: CancellationToken,
}

/// The batch task, to stop at the end.
pub(super) struct Handle {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

/// Spawns the batch task (on the current runtime) for `exporter`.
pub(super) fn start<E: SpanExporter + 'static>(
    mut exporter: E,
    resource: &Resource,
    config: &OtlpConfig,
) -> (Processor, Handle) {
    exporter.set_resource(resource);
    let (queue, spans) = mpsc::channel(config.max_queue);
    let stop = CancellationToken::new();
    // The endpoint as written (`${VAR}` unexpanded, user info replaced): it is logged.
    let task = tokio::spawn(run(exporter, spans, stop.clone(), config.timeout, config.endpoint.to_string()));
    (Processor { queue, stop: stop.clone() }, Handle { stop, task })
}

impl SpanProcessor for Processor {
    fn on_start(&self, _: &mut Span, _: &Context) {}

    fn on_end(&self, span: SpanData) {
        if !span.span_context.is_sampled() {
            return;
        }
        if self.queue.try_send(span).is_err() {
            metrics::counter!(names::TRACE_SPANS_DROPPED, "reason" => "queue_full").increment(1);
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        // The task sends at least every EXPORT_EVERY; the end of the process flushes
        // through `Handle::stop`, which can wait (this is called from sync code).
        Ok(())
    }

    fn shutdown_with_timeout(&self, _: Duration) -> OTelSdkResult {
        self.stop.cancel();
        Ok(())
    }
}

impl Handle {
    /// Sends what is queued, for at most `within`; the task is given up after that.
    pub(super) async fn stop(self, within: Duration) {
        self.stop.cancel();
        let mut task = self.task;
        if tokio::time::timeout(within, &mut task).await.is_err() {
            task.abort();
            warn!(?within, "trace export did not finish in time at exit; the last spans are dropped");
        }
    }
}

async fn run<E: SpanExporter>(
    exporter: E,
    mut spans: mpsc::Receiver<SpanData>,
    stop: CancellationToken,
    timeout: Duration,
    endpoint: String,
) {
    let mut out = Outcomes { endpoint, failing: None };
    let mut batch = Vec::with_capacity(MAX_BATCH);
    let mut tick = tokio::time::interval(EXPORT_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            span = spans.recv() => match span {
                Some(span) => {
                    batch.push(span);
                    if batch.len() >= MAX_BATCH {
                        out.export(&exporter, &mut batch, timeout).await;
                    }
                }
                None => break,
            },
            _ = tick.tick() => {
                if !batch.is_empty() {
                    out.export(&exporter, &mut batch, timeout).await;
                }
            }
            () = stop.cancelled() => break,
        }
    }
    // The end: what is queued now goes out (the caller bounds how long that may take).
    while let Ok(span) = spans.try_recv() {
        batch.push(span);
        if batch.len() >= MAX_BATCH {
            out.export(&exporter, &mut batch, timeout).await;
        }
    }
    if !batch.is_empty() {
        out.export(&exporter, &mut batch, timeout).await;
    }
    let _ = exporter.shutdown_with_timeout(timeout);
}

/// What the log has said about failing exports.
struct Outcomes {
    /// As written in the config: never what `${VAR}` resolved to.
    endpoint: String,
    /// While exports fail: when the log last said so, and the spans dropped since.
    failing: Option<(Instant, u64)>,
}

impl Outcomes {
    /// Sends `batch` (emptied either way) and counts what became of it.
    async fn export<E: SpanExporter>(&mut self, exporter: &E, batch: &mut Vec<SpanData>, timeout: Duration) {
        let spans = batch.len() as u64;
        let sent = std::mem::replace(batch, Vec::with_capacity(MAX_BATCH));
        let error = match tokio::time::timeout(timeout, exporter.export(sent)).await {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(e.to_string()),
            Err(_) => Some(format!("no answer within {timeout:?}")),
        };
        match error {
            None => {
                metrics::counter!(names::TRACE_SPANS_EXPORTED).increment(spans);
                if let Some((_, dropped)) = self.failing.take() {
                    info!(endpoint = %self.endpoint, dropped, "trace export works again");
                }
            }
            Some(error) => {
                metrics::counter!(names::TRACE_SPANS_DROPPED, "reason" => "export_failed").increment(spans);
                match &mut self.failing {
                    None => {
                        warn!(endpoint = %self.endpoint, %error, spans,
                            "trace export failed; spans are dropped while the collector does not answer (events are not affected)");
                        self.failing = Some((Instant::now(), 0));
                    }
                    Some((since, dropped)) => {
                        *dropped += spans;
                        if since.elapsed() >= REPORT_EVERY {
                            warn!(endpoint = %self.endpoint, %error, dropped, "trace export still failing");
                            *since = Instant::now();
                            *dropped = 0;
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use opentelemetry::trace::{Span as _, Tracer as _, TracerProvider as _};
    use opentelemetry_sdk::error::OTelSdkError;
    use opentelemetry_sdk::trace::SdkTracerProvider;

    use super::*;

    /// A collector that refuses every export.
    #[derive(Debug)]
    struct Refusing;

    impl SpanExporter for Refusing {
        async fn export(&self, _: Vec<SpanData>) -> OTelSdkResult {
            Err(OTelSdkError::InternalFailure("refused".into()))
        }
    }

    /// The log lines written while it is the default subscriber's writer.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[tokio::test]
    async fn a_failing_export_logs_the_endpoint_as_written_never_its_secrets() {
        let env = |name: &str| match name {
            "OTLP_PASSWORD" => Some("pa55w0rd-from-env".to_owned()),
            "OTLP_TENANT" => Some("tenant-t0ken-from-env".to_owned()),
            _ => None,
        };
        let text = r#"
            [kafka]
            brokers = "127.0.0.1:9"
            group_id = "g"
            [store]
            path = "/nonexistent"
            [tracing.otlp]
            endpoint = "https://ingest:${OTLP_PASSWORD}@otlp.example/${OTLP_TENANT}"
            [[handlers]]
            topics = ["t"]
            kind = "log"
        "#;
        let config = crate::config::Config::parse(text, &env).unwrap().otlp.unwrap();
        let logs = Captured::default();
        let writer = logs.clone();
        let subscriber = tracing_subscriber::fmt().with_ansi(false).with_writer(move || writer.clone()).finish();
        let _logging = tracing::subscriber::set_default(subscriber);

        let (processor, handle) = start(Refusing, &Resource::builder_empty().build(), &config);
        let provider = SdkTracerProvider::builder().with_span_processor(processor).build();
        provider.tracer("test").start("event").end();
        // Stopping sends what is queued: the refused export is logged.
        handle.stop(Duration::from_secs(5)).await;

        let logged = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
        assert!(logged.contains("trace export failed"), "{logged}");
        for secret in ["pa55w0rd-from-env", "tenant-t0ken-from-env", "ingest:"] {
            assert!(!logged.contains(secret), "{secret} in the log: {logged}");
        }
        assert!(logged.contains("https://<redacted>@otlp.example/${OTLP_TENANT}/v1/traces"), "as written: {logged}");
    }
}
