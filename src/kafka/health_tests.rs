//! The brokers' reachability and its lines: pure logic of `health::Reach`, the time passed in.

use super::*;

const EVERY: Duration = Duration::from_secs(30);

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// A state made at `t0`, and a way to say "s seconds later".
fn reach() -> (Reach, Instant, SystemTime) {
    let (t0, wall) = (Instant::now(), SystemTime::now());
    (Reach::new(t0, wall, EVERY), t0, wall)
}

/// librdkafka's pair for a refused connection: the failure, then "all brokers down".
fn refused(r: &mut Reach, at: Instant, wall: SystemTime, client: &'static str, decides: bool) -> Vec<Line> {
    [
        r.failed(at, wall, client, false, decides, "b:9092/bootstrap: Connect failed: Connection refused".into()),
        r.failed(at, wall, client, true, decides, "1/1 brokers are down".into()),
    ]
    .into_iter()
    .flatten()
    .collect()
}

#[test]
fn an_outage_is_one_warning_then_a_summary_per_interval_then_one_line_back() {
    let (mut r, t0, wall) = reach();
    assert_eq!(r.reached(t0 + secs(1), wall), Some(Line::Connected { after: secs(1) }));
    let down = t0 + secs(10);
    assert_eq!(
        refused(&mut r, down, wall, "consumer", true),
        [Line::Unreachable {
            client: "consumer",
            error: "b:9092/bootstrap: Connect failed: Connection refused; 1/1 brokers are down".into(),
            every: EVERY
        }]
    );
    assert_eq!(r.state, Reachability::Unreachable);
    // Four clients, ten reconnects a second, for 29 s: not one line.
    let mut lines = Vec::new();
    for tenth in 1..290 {
        let at = down + Duration::from_millis(100 * tenth);
        for client in ["consumer", "changelog", "dead_letters", "restore"] {
            lines.extend(refused(&mut r, at, wall, client, client == "consumer"));
        }
    }
    assert!(lines.is_empty(), "{lines:?}");
    assert_eq!(r.errors, 289 * 8);
    let last = Some("b:9092/bootstrap: Connect failed: Connection refused".to_owned());
    assert_eq!(
        r.tick(down + secs(30)),
        Some(Line::StillUnreachable { away: secs(30), errors: 289 * 8, error: last.clone() })
    );
    assert_eq!(r.tick(down + secs(31)), None);
    lines.extend(refused(&mut r, down + secs(40), wall, "consumer", true));
    // librdkafka's reconnects back off to 10 s: "all down" alone says less than the last failure.
    lines.extend(r.failed(down + secs(48), wall, "changelog", true, false, "0/2 brokers are down".into()));
    assert!(lines.is_empty(), "{lines:?}");
    assert_eq!(r.tick(down + secs(60)), Some(Line::StillUnreachable { away: secs(60), errors: 3, error: last }));
    assert_eq!(r.reached(down + secs(65), wall), Some(Line::Back { away: secs(65), suppressed: 289 * 8 + 3 }));
    assert_eq!((r.state, r.errors), (Reachability::Reachable, 0));
    assert_eq!(r.reached(down + secs(66), wall), None);
}

#[test]
fn the_warning_quotes_the_connection_line_that_came_before_all_brokers_down() {
    let (mut r, t0, wall) = reach();
    r.reached(t0, wall);
    r.noted(t0 + secs(1), "consumer", "[thrd:b:9092/1]: b:9092/1: Disconnected: connection closed by peer");
    let line = r.failed(t0 + secs(1), wall, "consumer", true, true, "0/1 brokers are down".into());
    assert_eq!(
        line,
        Some(Line::Unreachable {
            client: "consumer",
            error: "b:9092/1: Disconnected: connection closed by peer; 0/1 brokers are down".into(),
            every: EVERY
        })
    );
    assert_eq!(r.errors, 0, "a noted line is not an error of its own");

    // One from long before says nothing about this outage.
    let (mut r, t0, wall) = reach();
    r.reached(t0, wall);
    r.noted(t0, "changelog", "b:9092/1: Disconnected (after 600000ms in state UP)");
    let line = r.failed(t0 + secs(3600), wall, "consumer", true, true, "1/1 brokers are down".into());
    assert!(matches!(line, Some(Line::Unreachable { error, .. }) if error == "1/1 brokers are down"));
}

#[test]
fn at_start_up_any_client_that_finds_no_broker_makes_them_unreachable() {
    let (mut r, t0, wall) = reach();
    let lines = refused(&mut r, t0 + Duration::from_millis(5), wall, "admin", false);
    assert!(matches!(lines.as_slice(), [Line::Unreachable { client: "admin", .. }]), "{lines:?}");
    let back = r.reached(t0 + Duration::from_millis(3005), wall);
    assert_eq!(back, Some(Line::Back { away: secs(3), suppressed: 0 }));
}

#[test]
fn an_idle_producer_that_lost_its_connection_does_not_make_reachable_brokers_unreachable() {
    let (mut r, t0, wall) = reach();
    r.reached(t0, wall);
    let at = t0 + secs(600);
    let lines = refused(&mut r, at, wall, "changelog", false);
    assert_eq!(r.state, Reachability::Reachable);
    assert!(
        matches!(lines.as_slice(), [Line::ClientErrors { client: "changelog", errors: 1, .. }]),
        "the first one is said at once: {lines:?}"
    );
    // The next ones within the interval are counted and said once at its end.
    let lines = refused(&mut r, at + secs(1), wall, "changelog", false);
    assert!(lines.is_empty(), "{lines:?}");
    assert_eq!(r.tick(at + secs(29)), None);
    assert!(matches!(r.tick(at + secs(30)), Some(Line::ClientErrors { errors: 3, .. })));
    assert_eq!(r.tick(at + secs(60)), None, "nothing new, nothing said");
}

#[test]
fn brokers_that_never_answer_get_a_line_per_interval_while_start_up_waits() {
    let (mut r, t0, wall) = reach();
    assert_eq!(r.tick(t0 + secs(29)), None);
    assert_eq!(r.tick(t0 + secs(30)), Some(Line::StillConnecting { waiting: secs(30), errors: 0, error: None }));
    r.failed(t0 + secs(31), wall, "consumer", false, true, "Connect timed out".into());
    assert_eq!(
        r.tick(t0 + secs(60)),
        Some(Line::StillConnecting { waiting: secs(60), errors: 1, error: Some("Connect timed out".into()) })
    );
    assert_eq!(r.reached(t0 + secs(61), wall), Some(Line::Connected { after: secs(61) }));
}

#[test]
fn connection_errors_are_told_from_other_errors() {
    assert!(is_connection_error(RDKafkaErrorCode::AllBrokersDown));
    assert!(is_connection_error(RDKafkaErrorCode::BrokerTransportFailure));
    assert!(!is_connection_error(RDKafkaErrorCode::UnknownTopicOrPartition));
    assert!(!is_connection_error(RDKafkaErrorCode::MessageTimedOut));
}

#[test]
fn durations_in_lines_are_whole_seconds_or_milliseconds() {
    assert_eq!(shown(Duration::from_millis(65_432)).to_string(), "1m 5s");
    assert_eq!(shown(Duration::from_micros(1_500)).to_string(), "1ms");
}
