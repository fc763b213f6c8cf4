//! The TLS/SASL example is a config librdkafka accepts (this build has TLS),
//! and check-config never prints its secrets. Nothing connects anywhere.

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_outboxd");

#[test]
fn tls_sasl_example_is_accepted_by_librdkafka_and_secrets_stay_hidden() {
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    let key = dir.path().join("ca.key");
    let made = Command::new("openssl")
        .args(["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=test-ca"])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&ca)
        .output()
        .expect("openssl is installed");
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));

    let example =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/outboxd-tls-sasl.toml")).unwrap();
    // Point the brokers at a closed local port: check-config must not need them.
    let config = example.replace(
        "brokers = \"kafka-1.example.internal:9094,kafka-2.example.internal:9094\"",
        "brokers = \"127.0.0.1:9\"",
    );
    assert_ne!(config, example, "the example's brokers line changed; update this test");
    let path = dir.path().join("outboxd.toml");
    std::fs::write(&path, config).unwrap();
    let check = |ca_file: &std::path::Path| {
        Command::new(BIN)
            .args(["check-config", "--config"])
            .arg(&path)
            .env("KAFKA_PASSWORD", "kafka-secret-value")
            .env("KAFKA_CA_FILE", ca_file)
            .env("ORDERS_TOKEN", "orders-secret-value")
            .output()
            .unwrap()
    };
    let out = check(&ca);
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{text}");
    assert!(text.contains("is valid"), "{text}");
    assert!(
        !text.contains("kafka-secret-value") && !text.contains("orders-secret-value"),
        "a secret was printed: {text}"
    );

    // librdkafka really checks: a missing CA file is an error naming kafka.options.
    let out = check(&dir.path().join("missing.pem"));
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && text.contains("kafka.options"), "{text}");
}
