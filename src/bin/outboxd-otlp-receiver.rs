//! A small OTLP/HTTP trace receiver, for tests and for looking at what outboxd exports:
//! it accepts `POST /v1/traces` in protobuf (what `[tracing.otlp]` sends), answers as a
//! collector does, and writes each span as one JSON line to stdout. It keeps nothing.
//!
//! `outboxd-otlp-receiver [ADDR]` (default `127.0.0.1:4318`; port 0 picks one). The
//! first line on stdout is `{"listening":"<addr>"}`; each span after it is
//! `{"trace_id","span_id","parent_span_id","name","kind","service","attributes",
//! "status":{"code","message"},"events","start_unix_nano","end_unix_nano"}` with the ids
//! in lower-case hex (`parent_span_id` empty for a root).

use std::io::Write as _;

use axum::body::Bytes;
use axum::http::{header, HeaderMap, StatusCode};
use axum::routing::post;
use axum::Router;
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
use prost::Message as _;
use serde_json::{json, Map, Value};

const DEFAULT_ADDR: &str = "127.0.0.1:4318";
/// Largest export request accepted; outboxd's batches are far smaller.
const MAX_BODY: usize = 16 << 20;

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::io::Result<()> {
    let addr = std::env::args().nth(1).unwrap_or_else(|| DEFAULT_ADDR.to_owned());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    print_line(&json!({ "listening": listener.local_addr()?.to_string() }));
    let app = Router::new().route("/v1/traces", post(traces)).layer(axum::extract::DefaultBodyLimit::max(MAX_BODY));
    axum::serve(listener, app).await
}

async fn traces(headers: HeaderMap, body: Bytes) -> (StatusCode, [(header::HeaderName, &'static str); 1], Vec<u8>) {
    let protobuf = [(header::CONTENT_TYPE, "application/x-protobuf")];
    let content_type = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    if !content_type.starts_with("application/x-protobuf") {
        return (StatusCode::UNSUPPORTED_MEDIA_TYPE, protobuf, Vec::new());
    }
    let Ok(request) = ExportTraceServiceRequest::decode(body) else {
        return (StatusCode::BAD_REQUEST, protobuf, Vec::new());
    };
    for resource_spans in request.resource_spans {
        let resource = resource_spans.resource.map(|r| attributes(&r.attributes)).unwrap_or_default();
        let service = resource.get("service.name").cloned().unwrap_or(Value::Null);
        for scope in resource_spans.scope_spans {
            for span in scope.spans {
                let status = span.status.map(|s| json!({ "code": s.code, "message": s.message }));
                print_line(&json!({
                    "trace_id": hex(&span.trace_id),
                    "span_id": hex(&span.span_id),
                    "parent_span_id": hex(&span.parent_span_id),
                    "name": span.name,
                    "kind": span.kind,
                    "service": service,
                    "attributes": attributes(&span.attributes),
                    "status": status,
                    "events": span.events.iter().map(|e| e.name.clone()).collect::<Vec<_>>(),
                    "start_unix_nano": span.start_time_unix_nano,
                    "end_unix_nano": span.end_time_unix_nano,
                }));
            }
        }
    }
    (StatusCode::OK, protobuf, ExportTraceServiceResponse::default().encode_to_vec())
}

fn attributes(kvs: &[KeyValue]) -> Map<String, Value> {
    kvs.iter().map(|kv| (kv.key.clone(), kv.value.as_ref().map_or(Value::Null, value))).collect()
}

fn value(v: &AnyValue) -> Value {
    match &v.value {
        Some(any_value::Value::StringValue(s)) => json!(s),
        Some(any_value::Value::BoolValue(b)) => json!(b),
        Some(any_value::Value::IntValue(i)) => json!(i),
        Some(any_value::Value::DoubleValue(d)) => json!(d),
        Some(any_value::Value::BytesValue(b)) => json!(hex(b)),
        Some(any_value::Value::ArrayValue(a)) => Value::Array(a.values.iter().map(value).collect()),
        Some(any_value::Value::KvlistValue(l)) => Value::Object(attributes(&l.values)),
        _ => Value::Null,
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// One line, written whole; a reader that went away is not an error worth stopping for.
fn print_line(v: &Value) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{v}").and_then(|()| out.flush());
}
