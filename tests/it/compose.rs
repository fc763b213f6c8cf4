//! docker-compose.yml cannot run here (no Docker engine), so this checks what can
//! be checked without it: it parses, every dependency waits on a health check
//! that exists, every mounted file exists, the connector registration really
//! rewrites connector.json for the compose network, and outboxd's config inside
//! it is valid and points at the compose services.

use std::path::Path;

use outboxd::config::{Config, HandlerSpec};
use serde_yaml_ng::Value;

fn repo(path: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn compose() -> Value {
    let text = std::fs::read_to_string(repo("docker-compose.yml")).expect("docker-compose.yml");
    serde_yaml_ng::from_str(&text).expect("docker-compose.yml is valid YAML")
}

fn services(c: &Value) -> &serde_yaml_ng::Mapping {
    c["services"].as_mapping().expect("services mapping")
}

#[test]
fn compose_has_every_service_of_the_pipeline() {
    let c = compose();
    for name in ["postgres", "kafka", "connect", "connector-init", "receiver", "outboxd"] {
        assert!(services(&c).contains_key(name), "service {name} missing");
    }
    assert_eq!(c["services"]["outboxd"]["build"].as_str(), Some("."));
    assert!(c["services"]["postgres"]["command"]
        .as_sequence()
        .unwrap()
        .iter()
        .any(|v| v.as_str() == Some("wal_level=logical")));
}

#[test]
fn compose_dependencies_wait_for_health_checks_that_exist() {
    let c = compose();
    let mut checked = 0;
    for (name, svc) in services(&c) {
        let Some(deps) = svc["depends_on"].as_mapping() else { continue };
        for (dep, cond) in deps {
            let dep = dep.as_str().unwrap();
            let target = &c["services"][dep];
            assert!(!target.is_null(), "{name:?} depends on unknown service {dep}");
            match cond["condition"].as_str() {
                Some("service_healthy") => {
                    assert!(
                        target["healthcheck"]["test"].is_sequence(),
                        "{name:?} waits for {dep}, which has no healthcheck"
                    )
                }
                Some("service_completed_successfully") => {
                    assert_eq!(target["restart"].as_str(), Some("no"), "{dep} must be a one-shot")
                }
                other => panic!("{name:?} -> {dep}: unexpected condition {other:?}"),
            }
            checked += 1;
        }
    }
    assert!(checked >= 6, "only {checked} dependencies checked");
}

#[test]
fn compose_bind_mounts_and_dockerfile_sources_exist() {
    let c = compose();
    for (name, svc) in services(&c) {
        for vol in svc["volumes"].as_sequence().into_iter().flatten() {
            let spec = vol.as_str().unwrap();
            if let Some(host) = spec.strip_prefix("./") {
                let host = host.split(':').next().unwrap();
                assert!(repo(host).exists(), "{name:?} mounts missing file {host}");
            }
        }
    }
    let dockerfile = std::fs::read_to_string(repo("Dockerfile")).unwrap();
    for line in dockerfile.lines().filter(|l| l.starts_with("COPY ") && !l.contains("--from")) {
        let parts: Vec<&str> = line.split_whitespace().collect();
        for src in &parts[1..parts.len() - 1] {
            assert!(repo(src).exists(), "Dockerfile copies missing {src}");
        }
    }
}

/// Applies the `sed -e 's/A/B/'` expressions of the connector-init command to connector.json.
#[test]
fn connector_registration_rewrites_the_production_config_for_compose() {
    let c = compose();
    let command = c["services"]["connector-init"]["command"][0].as_str().unwrap().to_owned();
    let sed = regex::Regex::new(r"-e 's/((?:[^/\\]|\\.)*)/((?:[^/\\]|\\.)*)/'").unwrap();
    let mut json = std::fs::read_to_string(repo("debezium/connector.json")).unwrap();
    let mut applied = 0;
    for cap in sed.captures_iter(&command) {
        let re = regex::Regex::new(&cap[1]).expect("sed pattern is a valid regex");
        assert!(re.is_match(&json), "sed pattern {:?} does not match connector.json", &cap[1]);
        json = re.replace(&json, &cap[2]).into_owned();
        applied += 1;
    }
    assert_eq!(applied, 3);
    let config: serde_json::Value = serde_json::from_str(&json).expect("rewritten connector.json is JSON");
    assert_eq!(config["database.hostname"], "postgres");
    assert_eq!(config["database.port"], "5432");
    assert_eq!(config["database.password"], "postgres");
    assert_eq!(config["transforms.outbox.type"], "io.debezium.transforms.outbox.EventRouter");
    assert!(command.contains("/connectors/outbox-connector/config"));
    assert_eq!(config["name"], "outbox-connector");
}

#[test]
fn outboxd_config_in_compose_is_valid_and_targets_compose_services() {
    let c = compose();
    let mount = c["services"]["outboxd"]["volumes"]
        .as_sequence()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .find(|v| v.ends_with(":/etc/outboxd/outboxd.toml:ro"))
        .expect("config mounted at /etc/outboxd/outboxd.toml");
    let host = mount.trim_start_matches("./").split(':').next().unwrap();
    let text = std::fs::read_to_string(repo(host)).unwrap();
    let config = Config::parse(&text, &|_| None).expect("valid outboxd config");
    assert_eq!(config.kafka.brokers, "kafka:9092");
    assert!(c["services"]["kafka"]["environment"]["KAFKA_ADVERTISED_LISTENERS"]
        .as_str()
        .unwrap()
        .contains("PLAINTEXT://kafka:9092"));
    let HandlerSpec::Http(http) = &config.handlers[0].spec else { panic!("first handler is http") };
    assert!(http.url.as_str().starts_with("http://receiver:18080/"), "{}", http.url.as_str());
    let receiver_entry = c["services"]["receiver"]["entrypoint"].as_sequence().unwrap();
    assert_eq!(receiver_entry[1].as_str(), Some("0.0.0.0:18080"));
    assert!(config.store.path.starts_with("/var/lib/outboxd"), "store must be on the data volume");
}
