//! The one door to OpenTelemetry. With `[tracing.otlp]`, the `outboxd` binary adds
//! [`layer`] to its subscriber: the spans outboxd's own code creates (one `event`
//! span per message and its children, `engine/spans/`) become OpenTelemetry spans,
//! batched on the runtime and sent to the collector over OTLP/HTTP (protobuf) by a
//! bounded queue (`batch`), with the reqwest client the service already links
//! (`client`). A collector that is away costs dropped spans, counted, never a
//! waiting event. Without the section there is no layer: the spans' call sites are
//! disabled (the log layer's filter is at `info`, the spans at `debug`) and each costs
//! a cached interest check.
//!
//! The rest of the crate sees plain data ([`TraceContext`]) and two functions:
//! [`set_parent`] makes an event's span the child of the context its message carried,
//! [`outgoing`] is the context a call from the current span sends on (`traceparent`).

mod batch;
mod client;

use std::time::Duration;

use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry::KeyValue;
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
use opentelemetry_sdk::Resource;
use tracing::level_filters::LevelFilter;
use tracing::subscriber::Interest;
use tracing::{Level, Metadata};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::{Context, Filter};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

use crate::config::OtlpConfig;
use crate::event::TraceContext;

/// How long the exit waits for the last spans to reach the collector: a collector
/// that is away must not hold up a stop (the drain has committed everything by then).
pub const FLUSH_TIMEOUT: Duration = Duration::from_secs(2);

/// The exporter's layer takes outboxd's own spans at `debug` and above (the per-event
/// spans are `debug`, so the log layer, at `info` unless told otherwise, never formats
/// them) and its log lines at `info` and above, which become events of the span they
/// are written in. Nothing of other crates: the exporter's own HTTP calls must not
/// become spans to export.
const SPANS: Level = Level::DEBUG;
const EVENTS: Level = Level::INFO;

/// Why the exporter could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// The HTTP client (its TLS backend) could not be built.
    #[error("tracing.otlp: the HTTP client: {0}")]
    Client(String),
    /// The OTLP exporter refused its settings.
    #[error("tracing.otlp: {0}")]
    Exporter(String),
}

/// The running exporter: flush it with [`Exporter::shutdown`] before the process exits.
pub struct Exporter {
    provider: SdkTracerProvider,
    batch: batch::Handle,
}

/// The exporter's layer for a subscriber, and the exporter to stop at the end. Must
/// be called on the runtime: the batch task is spawned on it.
pub fn layer<S>(config: &OtlpConfig) -> Result<(impl Layer<S> + Send + Sync, Exporter), SetupError>
where
    S: tracing::Subscriber + for<'span> LookupSpan<'span> + Send + Sync,
{
    let client = client::Client::new(config.timeout).map_err(|e| SetupError::Client(e.to_string()))?;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(client)
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(config.endpoint.expose())
        .with_timeout(config.timeout)
        .with_headers(config.headers.iter().cloned().collect())
        .build()
        // Its messages quote the endpoint: as written, never with what `${VAR}` resolved to.
        .map_err(|e| {
            SetupError::Exporter(e.to_string().replace(config.endpoint.expose(), &config.endpoint.to_string()))
        })?;
    let resource = Resource::builder()
        .with_service_name(config.service_name.clone())
        .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
        .build();
    let (processor, batch) = batch::start(exporter, &resource, config);
    // Parent-based: an event whose producer sampled its trace is sampled, one whose
    // producer did not is not (its receiver still gets the trace id, unsampled);
    // `sample_ratio` decides only for traces that start here.
    let sampler = Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(config.sample_ratio)));
    let provider = SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_sampler(sampler)
        .with_resource(resource)
        .build();
    let tracer = provider.tracer(env!("CARGO_PKG_NAME"));
    // Off what costs per span or per poll and tells nothing here: the source line
    // and thread of each span (the names say where), busy/idle times (a clock read
    // at every poll of an event), and making each span's context current on entry
    // (`outgoing` asks the span itself).
    let layer = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_location(false)
        .with_threads(false)
        .with_tracked_inactivity(false)
        .with_context_activation(false)
        .with_filter(Exported);
    Ok((layer, Exporter { provider, batch }))
}

impl Exporter {
    /// Sends what is queued, for at most [`FLUSH_TIMEOUT`]; what is left then is dropped.
    pub async fn shutdown(self) {
        self.batch.stop(FLUSH_TIMEOUT).await;
        // The batch task has ended: this only marks the provider shut down.
        let _ = self.provider.shutdown();
    }
}

/// The exporter layer's filter ([`SPANS`], [`EVENTS`]).
///
/// It answers `sometimes` for the call sites it wants, never `always`, so that no call
/// site is enabled without asking every filter each time. The reason is a flaw of
/// per-layer filtering in tracing-subscriber 0.3: when no filter wants an event (a
/// `log` record of sled at `debug`, which the exporter's `debug` level lets through
/// `log`'s own filter), the registry leaves each filter's "disabled" mark set on that
/// thread, and the next event of a call site every filter enables without asking is
/// then dropped by the log layer: a log line lost. Asked each time, the marks are
/// written afresh; that costs a filter check per span and log line while exporting.
struct Exported;

impl Exported {
    fn wants(meta: &Metadata<'_>) -> bool {
        let ours = meta.target().split("::").next() == Some(env!("CARGO_CRATE_NAME"));
        ours && *meta.level() <= if meta.is_span() { SPANS } else { EVENTS }
    }
}

impl<S> Filter<S> for Exported {
    fn enabled(&self, meta: &Metadata<'_>, _: &Context<'_, S>) -> bool {
        Exported::wants(meta)
    }

    fn callsite_enabled(&self, meta: &'static Metadata<'static>) -> Interest {
        if Exported::wants(meta) {
            Interest::sometimes()
        } else {
            Interest::never()
        }
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        Some(LevelFilter::from_level(SPANS))
    }
}

/// Makes `span` (new, not yet entered) the child of `context`, the trace context its
/// message carried. No context, or one the W3C propagator refuses, leaves it a root of
/// a new trace: never an error. Does nothing when no exporter wants the span.
pub fn set_parent(span: &tracing::Span, context: Option<&TraceContext>) {
    if span.is_disabled() {
        return;
    }
    let Some(parent) = context.map(remote_parent) else { return };
    if parent.span().span_context().is_valid() {
        let _ = span.set_parent(parent);
    }
}

/// The OpenTelemetry context of a remote parent (invalid when refused).
fn remote_parent(context: &TraceContext) -> opentelemetry::Context {
    TraceContextPropagator::new().extract(&Carrier(context))
}

/// The trace context a call made now sends on: the current span's own when spans are
/// exported (the receiver's spans become its children, and `tracestate` travels on),
/// else `incoming` as it came (the event's `traceparent`, forwarded unchanged).
pub fn outgoing(incoming: Option<&str>) -> Option<TraceContext> {
    let span = tracing::Span::current();
    if !span.is_disabled() {
        let context = span.context();
        if context.span().span_context().is_valid() {
            let mut out = Out::default();
            TraceContextPropagator::new().inject_context(&context, &mut out);
            if let Some(traceparent) = out.traceparent {
                return Some(TraceContext { traceparent, tracestate: out.tracestate });
            }
        }
    }
    incoming.map(|traceparent| TraceContext { traceparent: traceparent.to_owned(), tracestate: None })
}

/// A [`TraceContext`] as the propagator reads headers.
struct Carrier<'a>(&'a TraceContext);

impl Extractor for Carrier<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        match key {
            "traceparent" => Some(&self.0.traceparent),
            "tracestate" => self.0.tracestate.as_deref(),
            _ => None,
        }
    }

    fn keys(&self) -> Vec<&str> {
        vec!["traceparent", "tracestate"]
    }
}

/// What the propagator writes.
#[derive(Default)]
struct Out {
    traceparent: Option<String>,
    tracestate: Option<String>,
}

impl Injector for Out {
    fn set(&mut self, key: &str, value: String) {
        match key {
            "traceparent" => self.traceparent = Some(value),
            "tracestate" if !value.is_empty() => self.tracestate = Some(value),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use opentelemetry::trace::{SpanId, TraceId};

    use super::*;

    const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
    const PARENT: &str = "00f067aa0ba902b7";

    fn context(traceparent: &str, tracestate: Option<&str>) -> TraceContext {
        TraceContext { traceparent: traceparent.to_owned(), tracestate: tracestate.map(str::to_owned) }
    }

    #[test]
    fn a_valid_traceparent_is_the_remote_parent() {
        let cx = remote_parent(&context(&format!("00-{TRACE}-{PARENT}-01"), Some("congo=t61rcWkgMzE")));
        let span = cx.span();
        let parent = span.span_context();
        assert!(parent.is_valid() && parent.is_remote() && parent.is_sampled());
        assert_eq!(parent.trace_id(), TraceId::from_hex(TRACE).unwrap());
        assert_eq!(parent.span_id(), SpanId::from_hex(PARENT).unwrap());
        assert_eq!(parent.trace_state().header(), "congo=t61rcWkgMzE");
        let unsampled = remote_parent(&context(&format!("00-{TRACE}-{PARENT}-00"), None));
        assert!(!unsampled.span().span_context().is_sampled(), "the producer's decision travels");
    }

    #[test]
    fn a_malformed_traceparent_is_no_parent_and_no_error() {
        for bad in [
            String::new(),
            "garbage".to_owned(),
            format!("00-{}-{PARENT}-01", "0".repeat(32)),
            format!("00-{TRACE}-{}-01", "0".repeat(16)),
            format!("ff-{TRACE}-{PARENT}-01"),
            format!("00-{TRACE}-{PARENT}"),
            format!("00-{TRACE}x-{PARENT}-01"),
        ] {
            assert!(!remote_parent(&context(&bad, None)).span().span_context().is_valid(), "{bad:?}");
        }
        // A span without an exporter: nothing to parent, and nothing fails.
        set_parent(&tracing::Span::none(), Some(&context("garbage", None)));
        set_parent(&tracing::Span::none(), None);
    }

    #[test]
    fn with_the_layer_a_span_continues_the_context_and_calls_send_their_own() {
        use tracing_subscriber::layer::SubscriberExt as _;

        let provider = SdkTracerProvider::builder().build();
        let subscriber =
            tracing_subscriber::registry().with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
        tracing::subscriber::with_default(subscriber, || {
            let incoming = context(&format!("00-{TRACE}-{PARENT}-01"), Some("congo=t61rcWkgMzE"));
            let event = tracing::debug_span!("event");
            set_parent(&event, Some(&incoming));
            let sent = event.in_scope(|| outgoing(Some(&incoming.traceparent))).expect("a context to send");
            let own = event.context().span().span_context().span_id();
            assert_eq!(
                sent.traceparent,
                format!("00-{TRACE}-{own}-01"),
                "the span's own context, not the incoming one"
            );
            assert_ne!(own, SpanId::from_hex(PARENT).unwrap());
            assert_eq!(sent.tracestate.as_deref(), Some("congo=t61rcWkgMzE"));

            let root = tracing::debug_span!("event");
            set_parent(&root, Some(&context("garbage", None)));
            assert_ne!(root.context().span().span_context().trace_id(), TraceId::from_hex(TRACE).unwrap());
        });
    }

    #[test]
    fn without_an_exporter_the_incoming_traceparent_goes_on_unchanged() {
        let tp = format!("00-{TRACE}-{PARENT}-01");
        assert_eq!(outgoing(Some(&tp)), Some(context(&tp, None)));
        assert_eq!(outgoing(None), None);
    }
}
