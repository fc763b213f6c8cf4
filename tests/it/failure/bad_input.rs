//! Bad input never stops the service: every malformed message ends done or dead (and
//! dead-lettered), and the partition moves on.

use super::*;

/// How a bad-input case must end.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Ends {
    /// Handled (the receiver got it) and recorded done under this id.
    Done,
    /// Recorded dead with a reason and dead-lettered, without a handler call:
    /// under `undecodable/…` when `id` is `None`, else under that event id.
    Dead,
}

struct Case {
    name: &'static str,
    key: Option<Vec<u8>>,
    headers: Vec<(&'static str, Option<Vec<u8>>)>,
    value: Option<Vec<u8>>,
    ends: Ends,
    /// The event id outboxd will decode (`None`: it cannot decode one).
    id: Option<String>,
}

fn case(
    name: &'static str,
    key: Option<&[u8]>,
    headers: Vec<(&'static str, Option<Vec<u8>>)>,
    value: Option<Vec<u8>>,
) -> Case {
    Case { name, key: key.map(<[u8]>::to_vec), headers, value, ends: Ends::Dead, id: None }
}

impl Case {
    fn done(mut self, id: &str) -> Case {
        self.ends = Ends::Done;
        self.id = Some(id.to_string());
        self
    }

    /// Decoded, but the handler refuses it before any call.
    fn refused(mut self, id: &str) -> Case {
        self.ends = Ends::Dead;
        self.id = Some(id.to_string());
        self
    }
}

const BIG: usize = 10 * 1024 * 1024;

fn bad_inputs() -> Vec<Case> {
    let id = |s: &str| Some(s.as_bytes().to_vec());
    let u = || new_event_id();
    let mut cases = Vec::new();
    let (a, b, c, d, e, f, g, h, i, j, k) = (u(), u(), u(), u(), u(), u(), u(), u(), u(), u(), u());
    cases.push(case("id header is a JSON number", Some(b"k"), vec![("id", id("12345678"))], Some(b"{}".to_vec())));
    let n = format!("num-{}", &a[..8]);
    cases.pop();
    cases.push(case("id header is a bare number", Some(b"k"), vec![("id", id(&n))], Some(b"{}".to_vec())).done(&n));
    let obj = format!(r#"{{"not":"an id","n":"{}"}}"#, &b[..8]);
    cases.push(case("id header is a JSON object", Some(b"k"), vec![("id", id(&obj))], Some(b"{}".to_vec())).done(&obj));
    let env =
        format!(r#"{{"schema":{{"type":"int64"}},"payload":{}}}"#, 9_000_000_000u64 + u64::from(rand::random::<u16>()));
    let env_id = serde_json::from_str::<Value>(&env).unwrap()["payload"].to_string();
    cases.push(
        case("id header is an envelope with a number", Some(b"k"), vec![("id", id(&env))], Some(b"{}".to_vec()))
            .done(&env_id),
    );
    cases.push(case("id header has a null value", Some(b"k"), vec![("id", None)], Some(b"{}".to_vec())));
    cases.push(case("id header is empty", Some(b"k"), vec![("id", Some(Vec::new()))], Some(b"{}".to_vec())));
    cases.push(case(
        "id header repeated with different values",
        Some(b"k"),
        vec![("id", id(&c)), ("id", id(&d))],
        Some(b"{}".to_vec()),
    ));
    cases.push(
        case(
            "id header repeated with the same value",
            Some(b"k"),
            vec![("id", id(&e)), ("id", id(&e))],
            Some(b"{}".to_vec()),
        )
        .done(&e),
    );
    cases.push(case(
        "id header is not UTF-8",
        Some(b"k"),
        vec![("id", Some(vec![0xff, 0xfe, b'x']))],
        Some(b"{}".to_vec()),
    ));
    cases.push(case("id header is 600 bytes", Some(b"k"), vec![("id", Some(vec![b'x'; 600]))], Some(b"{}".to_vec())));
    cases.push(case("no headers at all", Some(b"k"), vec![], Some(b"{}".to_vec())));
    cases.push(
        case(
            "eventType header is binary",
            Some(b"k"),
            vec![("id", id(&f)), ("eventType", Some(vec![0, 0xff, 1, 0x80]))],
            Some(b"{}".to_vec()),
        )
        .done(&f),
    );
    cases.push(
        case(
            "value is binary garbage",
            Some(b"k"),
            vec![("id", id(&g))],
            Some((0..=255u8).rev().cycle().take(4096).collect()),
        )
        .done(&g),
    );
    cases.push(case("value is 10 MB", Some(b"big"), vec![("id", id(&h))], Some(vec![b'a'; BIG])).done(&h));
    cases.push(
        case(
            "key is not UTF-8",
            Some(&[0xc3, 0x28, 0xff, b'/', b'.', b'.']),
            vec![("id", id(&i))],
            Some(b"{}".to_vec()),
        )
        .done(&i),
    );
    let deep = "[".repeat(10_000) + &"]".repeat(10_000);
    cases.push(
        case("value is JSON nested 10,000 deep", Some(b"k"), vec![("id", id(&j))], Some(deep.clone().into_bytes()))
            .done(&j),
    );
    let deep_env = json!({"schema": {"type": "string", "name": "io.debezium.data.Json"}, "payload": deep}).to_string();
    cases.push(case(
        "embedded Debezium JSON nested 10,000 deep",
        Some(b"k"),
        vec![("id", id(&u()))],
        Some(deep_env.into_bytes()),
    ));
    let broken = r#"{"schema":{"type":"string","name":"io.debezium.data.Json"},"payload":"{not json"}"#;
    cases.push(case(
        "embedded Debezium JSON is broken",
        Some(b"k"),
        vec![("id", id(&u()))],
        Some(broken.as_bytes().to_vec()),
    ));
    cases.push(case("null value (tombstone)", Some(b"k"), vec![("id", id(&k))], None).done(&k));
    let trav = u();
    cases.push(
        case("key tries path traversal", Some(b"../../admin?x=1#frag"), vec![("id", id(&trav))], Some(b"{}".to_vec()))
            .done(&trav),
    );
    let crlf = format!("{}\r\nX-Injected: yes", &u()[..8]);
    // Without the Idempotency-Key header a re-execution would not be idempotent, and a
    // header cannot carry CR LF: refused (dead-lettered), never sent without the key.
    cases.push(case("id with CR LF", Some(b"k"), vec![("id", id(&crlf))], Some(b"{}".to_vec())).refused(&crlf));
    cases
}

/// Bad input of every kind on one partition: each message ends done or dead (with a
/// reason, on the dead-letter topic), nothing crashes, and the offsets reach the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_never_stops_the_service() {
    let kafka = Kafka::connect();
    // The broker's default limit is ~1 MB per message; this topic takes the 10 MB one.
    let topic = kafka.create_topic(&unique_name("bad-input"), 1, &[("max.message.bytes", "12000000")]).await;
    let dlq = kafka.create_topic(&unique_name("bad-input-dlq"), 1, &[]).await;
    let mut s = Scenario::on(kafka, topic);
    // Every case shares one key: each must be judged on its own, not held behind the first dead one.
    s.od.config.handler_extra = format!("on_dead = \"continue\"\n{}", dead_letter_toml(&dlq));
    s.run().await;
    let Scenario { kafka, topic, receiver: rx, mut od, offsets, .. } = s;
    let producer = Producer::new(kafka.brokers(), &[("message.max.bytes", "12000000")]);

    let cases = bad_inputs();
    let mut at: Vec<i64> = Vec::new();
    for c in &cases {
        let headers: Vec<(&str, Option<&[u8]>)> = c.headers.iter().map(|(k, v)| (*k, v.as_deref())).collect();
        let (_, off) = producer.send_raw(&topic, Some(0), c.key.as_deref(), &headers, c.value.as_deref()).await;
        at.push(off);
    }
    let sentinel = new_event_id();
    producer.send_event(&topic, "sentinel", &sentinel, Some("Test"), &json!({"last": true})).await;
    od.wait_until("the sentinel after all bad input", Duration::from_secs(120), || rx.answered_ok(&sentinel)).await;
    od.wait_until(format!("committed offsets to reach the end ({})", offsets.describe()), HANDLED_TIMEOUT, || {
        offsets.reached_end()
    })
    .await;
    od.assert_alive();
    od.stop();
    logs::assert_no_panic(&od);

    let records = cli::all_records(&od);
    let letters = kafka.read_topic(&dlq, DLQ_READ_TIMEOUT);
    let letter_at: HashMap<i64, &Message> = letters
        .iter()
        .filter_map(|m| m.header("outboxd.source.offset").and_then(|o| o.parse().ok()).map(|o| (o, m)))
        .collect();
    let mut problems = Vec::new();
    let mut dead = 0;
    for (c, off) in cases.iter().zip(&at) {
        match c.ends {
            Ends::Done => {
                let id = c.id.as_deref().unwrap();
                match records.get(id) {
                    Some(r) if r["state"] == "done" => {}
                    other => problems.push(format!("{}: expected done under id {id:?}, record {other:?}", c.name)),
                }
                let calls: Vec<_> = rx
                    .calls()
                    .into_iter()
                    .filter(|call| call.is_handler_call() && call.event_id.as_deref() == Some(id))
                    .collect();
                if calls.len() != 1 {
                    problems.push(format!("{}: expected one handler call, got {}", c.name, calls.len()));
                }
            }
            Ends::Dead => {
                dead += 1;
                let id = c.id.clone().unwrap_or_else(|| format!("undecodable/{topic}/0/{off}"));
                if rx.calls().iter().any(|call| call.is_handler_call() && call.event_id.as_deref() == Some(&id)) {
                    problems.push(format!("{}: the handler was called for an event that had to be refused", c.name));
                }
                match records.get(&id) {
                    Some(r) if r["state"] == "dead" && r["reason"].as_str().is_some_and(|t| !t.trim().is_empty()) => {
                        eprintln!("{}: dead: {}", c.name, r["reason"]);
                        if !r["dead_letter"].as_str().is_some_and(|p| p.starts_with(&dlq)) {
                            problems.push(format!("{}: dead record without its dead-letter position: {r}", c.name));
                        }
                    }
                    other => {
                        problems.push(format!("{}: expected a dead record {id} with a reason, got {other:?}", c.name))
                    }
                }
                match letter_at.get(off) {
                    Some(m) => {
                        if m.value != c.value || m.key != c.key {
                            problems.push(format!("{}: dead letter does not carry the original key/value", c.name));
                        }
                    }
                    None => problems.push(format!("{}: no dead letter for offset {off}", c.name)),
                }
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    assert_eq!(letters.len(), dead, "one dead letter per undecodable or refused message");

    // What the receiver got for some of them.
    let calls = rx.calls();
    let by_name = |name: &str| {
        let c = cases.iter().find(|c| c.name == name).unwrap();
        calls.iter().find(|call| call.event_id.as_deref() == c.id.as_deref()).cloned().expect("call")
    };
    let big = by_name("value is 10 MB");
    assert_eq!(big.body_len, BIG, "the 10 MB payload arrives whole");
    let garbage = by_name("value is binary garbage");
    assert_eq!(garbage.header("Content-Type"), Some("application/octet-stream"));
    let trav = by_name("key tries path traversal");
    assert!(
        trav.path.starts_with("/events/") && !trav.path.contains("/admin"),
        "key escaped its path segment: {}",
        trav.path
    );
    assert!(calls.iter().all(|call| call.header("X-Injected").is_none()), "a CR LF in an id injected a header");
    let crlf = cases.iter().find(|c| c.name == "id with CR LF").and_then(|c| c.id.clone()).unwrap();
    let reason = records[&crlf]["reason"].as_str().unwrap_or_default().to_owned();
    assert!(reason.contains("Idempotency-Key"), "the refusal says why: {reason}");
    let tomb = by_name("null value (tombstone)");
    assert_eq!(tomb.body_len, 0);
}

/// A 10 MB message that cannot be decoded (more than librdkafka's default 1 MB) reaches
/// a dead-letter topic that accepts 12 MB messages like any other, and the partition
/// moves on (invariant 6).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_undecodable_message_is_dead_lettered() {
    let kafka = Kafka::connect();
    let big_topic = [("max.message.bytes", "12000000")];
    let topic = kafka.create_topic(&unique_name("big-src"), 1, &big_topic).await;
    let dlq = kafka.create_topic(&unique_name("big-dlq"), 1, &big_topic).await;
    let Scenario { kafka, topic, receiver: rx, mut od, offsets, .. } = Scenario::on(kafka, topic);
    od.config.handler_extra = dead_letter_toml(&dlq);
    let producer = Producer::new(kafka.brokers(), &[("message.max.bytes", "12000000")]);
    let value = vec![b'z'; BIG];
    let (_, off) = producer.send_raw(&topic, Some(0), Some(b"k"), &[("id", Some(b""))], Some(&value)).await;
    let after = new_event_id();
    producer.send_event(&topic, "k2", &after, Some("Test"), &json!({})).await;
    od.start();
    od.wait_for_assignment().await;
    od.wait_until("the event after the big one", HANDLED_TIMEOUT, || rx.answered_ok(&after)).await;
    let stalled = || {
        format!(
            "committed offsets did not reach the end ({}); dead-letter errors logged: {:?}",
            offsets.describe(),
            log_lines(&od, "dead-letter produce failed").into_iter().take(3).collect::<Vec<_>>()
        )
    };
    let reached = harness::wait_at_most(HANDLED_TIMEOUT, Duration::from_millis(200), || offsets.reached_end()).await;
    assert!(reached, "{}", stalled());
    od.stop();
    let letters = kafka.read_topic(&dlq, DLQ_READ_TIMEOUT);
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].value.as_ref().map(Vec::len), Some(BIG));
    let r = cli::get(&od, &format!("undecodable/{topic}/0/{off}"));
    assert_eq!(text(&r, "state"), "dead", "{r}");
}
