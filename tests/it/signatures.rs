//! Signed calls (`[handlers.sign]`, Standard Webhooks), checked by the specification's
//! reference package from PyPI, not by our own code.

use std::time::Duration;

use crate::harness::receiver::Reply;
use crate::harness::{self, verifier, Scenario};
use serde_json::json;

const HANDLED_TIMEOUT: Duration = Duration::from_secs(60);
/// 24 bytes each, as the platforms that mint `whsec_` secrets give them.
const CURRENT: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const PREVIOUS: &str = "whsec_c2lnbmVkLWJlZm9yZS10aGUtcm90YXRpb24h";
const OTHER: &str = "whsec_bm90LXRoZS1yZWNlaXZlcnMtc2VjcmV0LXh4eHg=";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_call_is_signed_as_the_reference_package_verifies_during_a_rotation_and_on_each_retry() {
    let mut s = Scenario::new("signed", 1).await;
    s.od.config.handler_extra = format!(
        "[handlers.sign]\nscheme = \"standard-webhooks\"\nsecret = \"{CURRENT}\"\nprevious = [\"{PREVIOUS}\"]\n"
    );
    s.run().await;
    let Scenario { topic, receiver, mut od, offsets, producer, .. } = s;

    let retried = harness::new_event_id();
    // Retried two seconds later (`Retry-After` is a floor of the delay): the retry's
    // timestamp (whole seconds) and signature differ.
    let first_call_of = retried.clone();
    receiver.set_script(move |req| match (req.event_id.as_deref(), req.nth) {
        (Some(id), 1) if id == first_call_of => Reply::status(429).retry_after("2"),
        _ => Reply::ok(),
    });
    // The specification signs "{id}.{timestamp}.{body}": an id with a dot is sent encoded.
    let dotted = format!("order.{}", harness::new_event_id());
    let plain = harness::new_event_id();
    for (id, payload) in [
        (&retried, json!({"n": 1, "text": "één € \"quoted\""})),
        (&dotted, json!({"n": 2})),
        (&plain, json!([1, 2, {"deep": {"er": null}}])),
    ] {
        producer.send_event(&topic, "order-7", id, Some("OrderPaid"), &payload).await;
    }
    od.wait_until("every event answered", HANDLED_TIMEOUT, || {
        [&retried, &dotted, &plain].iter().all(|id| receiver.answered(id))
    })
    .await;
    od.wait_until("committed offsets at the end", HANDLED_TIMEOUT, || offsets.reached_end()).await;
    od.stop();

    let calls: Vec<_> = [&retried, &dotted, &plain].iter().flat_map(|id| receiver.calls_for(id)).collect();
    assert_eq!(calls.len(), 4, "one retry, three events: {calls:#?}");
    let all: Vec<_> = calls.iter().map(|c| (c, None)).collect();
    for secret in [CURRENT, PREVIOUS] {
        for (call, verdict) in calls.iter().zip(verifier::verify(secret, &all)) {
            assert_eq!(verdict, Ok(()), "{secret}: {call:#?}");
        }
    }
    // The verifier refuses what it should: another secret, a body changed on the way.
    for verdict in verifier::verify(OTHER, &all) {
        assert!(verdict.is_err(), "a signature verified with a secret outboxd does not have");
    }
    let tampered: Vec<_> = calls.iter().map(|c| (c, Some(&b"{\"n\": 9}"[..]))).collect();
    for verdict in verifier::verify(CURRENT, &tampered) {
        assert!(verdict.is_err(), "a signature verified over a body that was not sent");
    }

    // The id is the idempotency key, the same on the retry; the retry is signed anew.
    let attempts = receiver.calls_for(&retried);
    assert_eq!(attempts.len(), 2);
    let (first, second) = (&attempts[0], &attempts[1]);
    assert_eq!(first.header("webhook-id"), Some(retried.as_str()));
    assert_eq!(second.header("webhook-id"), first.header("webhook-id"));
    assert_eq!(second.header("idempotency-key"), Some(retried.as_str()));
    assert_ne!(second.header("webhook-timestamp"), first.header("webhook-timestamp"), "each attempt its own time");
    assert_ne!(second.header("webhook-signature"), first.header("webhook-signature"));
    let signatures = first.header("webhook-signature").unwrap_or_default();
    assert_eq!(signatures.split(' ').count(), 2, "the current and the previous secret: {signatures}");
    let dotted_call = &receiver.calls_for(&dotted)[0];
    assert_eq!(dotted_call.header("webhook-id"), Some(dotted.replace('.', "%2E").as_str()));
}
