//! The trace context a message carries. Debezium's EventRouter, when Kafka Connect has
//! the OpenTelemetry API on its class path, reads the outbox row's `tracingspancontext`
//! column (a `java.util.Properties` text the writing service put there), starts its
//! `db-log-write` span as that context's child and injects its own context into the
//! record's headers with the worker's propagators: a `traceparent` header (and
//! `tracestate` when the state is not empty; `baggage` too when configured, which outboxd
//! ignores). A Kafka producer instrumentation replaces them with its send span's
//! context, the same two headers. Without OpenTelemetry on Connect the column can still
//! be placed as a header (`table.fields.additional.placement=tracingspancontext:header:tracingspancontext`),
//! and its properties text is read here. The `traceparent` header wins over the
//! column: it is the later hop of the same trace.
//!
//! Values pass through [`decode_text`] (a JSON header converter quotes or envelopes
//! them). Anything that is not a valid context is no context: the event starts a trace
//! of its own, and nothing malformed is ever forwarded.

use super::{decode_text, last_header};
use crate::event::{RawMessage, TraceContext};

/// W3C trace context: the longest `tracestate` a vendor must propagate.
const MAX_TRACESTATE_LEN: usize = 512;
/// Debezium's default `tracing.span.context.field`, the outbox column of that name.
const SPAN_CONTEXT_HEADER: &str = "tracingspancontext";

/// The message's trace context, if it carries a valid one.
pub fn trace_context(msg: &RawMessage) -> Option<TraceContext> {
    if let Some(traceparent) = last_header(msg, "traceparent").map(decode_text).filter(|t| is_traceparent(t)) {
        let tracestate = last_header(msg, "tracestate").map(decode_text).filter(|s| is_tracestate(s));
        return Some(TraceContext { traceparent, tracestate });
    }
    let properties = decode_text(last_header(msg, SPAN_CONTEXT_HEADER)?);
    let traceparent = property(&properties, "traceparent").filter(|t| is_traceparent(t))?;
    let tracestate = property(&properties, "tracestate").filter(|s| is_tracestate(s));
    Some(TraceContext { traceparent, tracestate })
}

/// `00-<32 hex>-<16 hex>-<2 hex>`, lower case, ids not all zero, version not `ff`.
fn is_traceparent(t: &str) -> bool {
    let parts: Vec<&str> = t.split('-').collect();
    let hex = |p: &str| p.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    parts.len() == 4
        && [2, 32, 16, 2].iter().zip(&parts).all(|(n, p)| p.len() == *n && hex(p))
        && parts[0] != "ff"
        && parts[1].bytes().any(|b| b != b'0')
        && parts[2].bytes().any(|b| b != b'0')
}

/// Printable ASCII (what a header can carry unchanged), within the W3C length.
fn is_tracestate(s: &str) -> bool {
    !s.is_empty() && s.len() <= MAX_TRACESTATE_LEN && s.bytes().all(|b| (0x20..0x7f).contains(&b))
}

/// The value of `key` in `java.util.Properties` text (`Properties.store` writes
/// `key=value` lines after a `#` date comment, with `=`, `:`, `#`, `!` and `\`
/// escaped by a backslash; `key: value` and `key value` are valid too).
fn property(text: &str, key: &str) -> Option<String> {
    text.lines().find_map(|line| {
        let line = line.trim_start();
        if line.is_empty() || line.starts_with('#') || line.starts_with('!') {
            return None;
        }
        let (k, rest) = split_key(line);
        let rest = rest.trim_start();
        (k == key).then(|| unescape(rest.strip_prefix(['=', ':']).unwrap_or(rest).trim_start()))
    })
}

/// The key (unescaped) and what follows its separator.
fn split_key(line: &str) -> (String, &str) {
    let mut key = String::new();
    let mut chars = line.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '\\' => {
                if let Some((_, next)) = chars.next() {
                    key.push(next);
                }
            }
            '=' | ':' | ' ' | '\t' => return (key, &line[i..]),
            c => key.push(c),
        }
    }
    (key, "")
}

fn unescape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    let mut chars = value.trim_end().chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('t') => out.push('\t'),
            Some('n') => out.push('\n'),
            Some('r') => out.push('\r'),
            Some('f') => out.push('\x0c'),
            Some('u') => {
                let hex: String = chars.by_ref().take(4).collect();
                out.extend(u32::from_str_radix(&hex, 16).ok().and_then(char::from_u32));
            }
            Some(other) => out.push(other),
            None => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    fn msg(headers: &[(&str, &[u8])]) -> RawMessage {
        RawMessage {
            headers: headers.iter().map(|(k, v)| ((*k).to_owned(), Some(v.to_vec()))).collect(),
            ..RawMessage::default()
        }
    }

    #[test]
    fn the_traceparent_and_tracestate_headers_are_the_context() {
        let c =
            trace_context(&msg(&[("id", b"e"), ("traceparent", TP.as_bytes()), ("tracestate", b"congo=t61rcWkgMzE")]));
        assert_eq!(c, Some(TraceContext { traceparent: TP.into(), tracestate: Some("congo=t61rcWkgMzE".into()) }));
        // A JSON header converter, with or without its schema envelope.
        let json = format!("{{\"schema\":{{\"type\":\"string\"}},\"payload\":\"{TP}\"}}");
        let c = trace_context(&msg(&[("traceparent", json.as_bytes()), ("tracestate", b"\"a=1\"")])).unwrap();
        assert_eq!((c.traceparent.as_str(), c.tracestate.as_deref()), (TP, Some("a=1")));
        // The last one wins: a producer instrumentation adds its own after Debezium's.
        let later = "00-4bf92f3577b34da6a3ce929d0e0e4736-1111111111111111-01";
        let c = trace_context(&msg(&[("traceparent", TP.as_bytes()), ("traceparent", later.as_bytes())])).unwrap();
        assert_eq!(c.traceparent, later);
    }

    #[test]
    fn debeziums_span_context_column_is_read_as_java_properties() {
        // What `Properties.store` writes: a date comment, escaped `=` in values.
        let props = format!(
            "#Thu Nov 29 10:00:00 UTC 2026\ntraceparent={TP}\ntracestate=rojo\\=00f067aa0ba902b7,congo\\=t61rc\n"
        );
        let c = trace_context(&msg(&[("tracingspancontext", props.as_bytes())])).unwrap();
        assert_eq!(c.traceparent, TP);
        assert_eq!(c.tracestate.as_deref(), Some("rojo=00f067aa0ba902b7,congo=t61rc"));
        let colon = format!("! another comment\r\n  traceparent : {TP}\r\n");
        assert_eq!(trace_context(&msg(&[("tracingspancontext", colon.as_bytes())])).unwrap().traceparent, TP);
        // The header is the later hop: it wins over the column.
        let later = "00-4bf92f3577b34da6a3ce929d0e0e4736-1111111111111111-01";
        let both = msg(&[("tracingspancontext", props.as_bytes()), ("traceparent", later.as_bytes())]);
        assert_eq!(trace_context(&both).unwrap(), TraceContext { traceparent: later.into(), tracestate: None });
    }

    #[test]
    fn a_missing_or_malformed_context_is_none() {
        assert_eq!(trace_context(&msg(&[("id", b"e")])), None);
        for bad in [
            "00-zz\r\nX: y",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "",
        ] {
            assert_eq!(trace_context(&msg(&[("traceparent", bad.as_bytes())])), None, "{bad:?}");
        }
        let props = "tracestate=a=1\n";
        assert_eq!(trace_context(&msg(&[("tracingspancontext", props.as_bytes())])), None);
        // A tracestate a header cannot carry is left out, the traceparent kept.
        let c = trace_context(&msg(&[("traceparent", TP.as_bytes()), ("tracestate", b"a=1\r\nX: y")])).unwrap();
        assert_eq!(c.tracestate, None);
    }
}
