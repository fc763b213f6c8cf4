//! Standard Webhooks signatures of an HTTP call (`[handlers.sign]`): the receiver
//! checks that the call is ours and recent with a library of its own.
//!
//! `webhook-id` is the event's idempotency key, the same across retries,
//! replays and failovers, so a receiver that dedups on it dedups right; each
//! attempt has its own `webhook-timestamp` and signs the exact bytes it sends.

use std::borrow::Cow;

use base64::Engine as _;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use crate::config::SignConfig;

/// The `webhook-id` of an event id. The signed content is `{id}.{timestamp}.{body}`,
/// so the specification's ids have no `.`; an event id with one is sent with each
/// `.` as `%2E` (and each `%` as `%25`, so two ids never meet): the same id every time.
pub fn webhook_id(event_id: &str) -> Cow<'_, str> {
    if !event_id.contains(['.', '%']) {
        return Cow::Borrowed(event_id);
    }
    Cow::Owned(event_id.replace('%', "%25").replace('.', "%2E"))
}

/// The `webhook-signature` value: `v1,<base64>` per key, separated by spaces.
pub fn signatures(sign: &SignConfig, id: &str, timestamp: u64, body: &[u8]) -> String {
    let timestamp = timestamp.to_string();
    let mut out = String::new();
    for key in sign.keys() {
        let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes a key of any length");
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.as_bytes());
        mac.update(b".");
        mac.update(body);
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str("v1,");
        base64::engine::general_purpose::STANDARD.encode_string(mac.finalize().into_bytes(), &mut out);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn sign_config(secrets: &str) -> SignConfig {
        let toml = format!(
            "[kafka]\nbrokers = \"127.0.0.1:9\"\ngroup_id = \"g\"\n[store]\npath = \"s\"\n\
             [[handlers]]\ntopics = [\"t\"]\nkind = \"http\"\nurl = \"http://127.0.0.1:1/e\"\n\
             [handlers.sign]\nscheme = \"standard-webhooks\"\n{secrets}\n"
        );
        let config = Config::parse(&toml, &|_| None).unwrap_or_else(|e| panic!("{e:#}"));
        match &config.handlers[0].spec {
            crate::config::HandlerSpec::Http(http) => http.sign.clone().expect("signed"),
            _ => panic!("http"),
        }
    }

    /// The example of the Standard Webhooks specification and its libraries' tests.
    #[test]
    fn the_specifications_example_signs_alike() {
        let sign = sign_config("secret = \"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"");
        let got = signatures(&sign, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, br#"{"test": 2432232314}"#);
        assert_eq!(got, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
    }

    #[test]
    fn a_rotation_signs_with_every_secret_the_current_first() {
        let sign = sign_config(
            "secret = \"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"\nprevious = [\"whsec_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA\"]",
        );
        let got = signatures(&sign, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, br#"{"test": 2432232314}"#);
        let parts: Vec<&str> = got.split(' ').collect();
        assert_eq!(parts.len(), 2, "{got}");
        assert_eq!(parts[0], "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
        assert!(parts[1].starts_with("v1,") && parts[1] != parts[0], "{got}");
    }

    #[test]
    fn ids_with_a_dot_are_encoded_the_same_way_every_time_and_apart() {
        assert_eq!(webhook_id("0b7e5c1a-uuid"), "0b7e5c1a-uuid");
        assert_eq!(webhook_id("order.42"), "order%2E42");
        assert_eq!(webhook_id("order%2E42"), "order%252E42");
        assert_ne!(webhook_id("a.b"), webhook_id("a%2Eb"));
    }
}
