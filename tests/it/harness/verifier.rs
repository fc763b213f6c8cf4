//! The Standard Webhooks reference package from PyPI (`standardwebhooks`, installed
//! by `scripts/stack up`), checking the signatures of calls the receiver recorded:
//! an implementation that is not ours.

use std::io::Write as _;
use std::process::{Command, Stdio};

use base64::Engine as _;

use super::Call;

/// Reads JSON lines `{"headers": {...}, "body": "<base64>"}` and prints, per line,
/// `ok` or what the package's `Webhook.verify` raised.
const SCRIPT: &str = r#"
import base64, json, sys
from standardwebhooks.webhooks import Webhook
hook = Webhook(sys.argv[1])
for line in sys.stdin:
    call = json.loads(line)
    try:
        hook.verify(base64.b64decode(call["body"]), call["headers"], json_parse=False)
        print("ok")
    except Exception as e:
        print("refused: %s: %s" % (type(e).__name__, e))
"#;

/// What the package says of each call's signature with `secret`: `Ok` or its refusal.
pub fn verify(secret: &str, calls: &[(&Call, Option<&[u8]>)]) -> Vec<Result<(), String>> {
    let path = std::env::var("OUTBOXD_TEST_WEBHOOK_VERIFIER")
        .expect("OUTBOXD_TEST_WEBHOOK_VERIFIER is unset: `scripts/stack up` installs the verifier; source .stack/env");
    let mut child = Command::new("python3")
        .args(["-c", SCRIPT, secret])
        .env("PYTHONPATH", &path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 runs");
    let mut input = String::new();
    for (call, body) in calls {
        let body = body.unwrap_or(&call.raw);
        let line = serde_json::json!({
            "headers": call.headers,
            "body": base64::engine::general_purpose::STANDARD.encode(body),
        });
        input.push_str(&line.to_string());
        input.push('\n');
    }
    child.stdin.take().expect("stdin").write_all(input.as_bytes()).expect("the verifier reads its input");
    let out = child.wait_with_output().expect("the verifier ends");
    assert!(out.status.success(), "the verifier failed: {}", out.status);
    let text = String::from_utf8_lossy(&out.stdout);
    let answers: Vec<Result<(), String>> =
        text.lines().map(|l| if l == "ok" { Ok(()) } else { Err(l.to_owned()) }).collect();
    assert_eq!(answers.len(), calls.len(), "one answer per call: {text}");
    answers
}
