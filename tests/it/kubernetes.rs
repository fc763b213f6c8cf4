//! deploy/kubernetes/outboxd.yaml cannot be applied here (no cluster), so this checks
//! what can be checked without one: the documents parse, outboxd's config inside is
//! valid and keeps the state in the changelog, the probes reach the admin server's
//! open endpoints, the store needs no persistent volume, a drain ends before the
//! kubelet's SIGKILL, and the disruption budget selects the Deployment's pods.

use std::path::Path;

use outboxd::config::Config;
use serde::Deserialize;
use serde_yaml_ng::Value;

fn documents() -> Vec<Value> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/kubernetes/outboxd.yaml");
    let text = std::fs::read_to_string(&path).expect("deploy/kubernetes/outboxd.yaml");
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|doc| Value::deserialize(doc).expect("each document is valid YAML"))
        .collect()
}

fn kind<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    let mut of_kind = docs.iter().filter(|d| d["kind"].as_str() == Some(kind));
    let found = of_kind.next().unwrap_or_else(|| panic!("no {kind} in the manifest"));
    assert!(of_kind.next().is_none(), "one {kind} expected");
    found
}

/// The config in the ConfigMap, as outboxd reads it (the admin token and the
/// changelog key from the env, which the container takes from Secrets).
fn config(docs: &[Value]) -> Config {
    let toml = kind(docs, "ConfigMap")["data"]["outboxd.toml"].as_str().expect("data.outboxd.toml");
    let from_secrets: Vec<String> = container(docs)["env"]
        .as_sequence()
        .expect("the container's env")
        .iter()
        .filter(|e| e["valueFrom"].get("secretKeyRef").is_some())
        .map(|e| e["name"].as_str().unwrap().to_owned())
        .collect();
    let env = |name: &str| {
        from_secrets.iter().any(|n| n == name).then(|| format!("{name}-from-the-secret-0123456789abcdef0123456789"))
    };
    Config::parse(toml, &env).expect("the ConfigMap's outboxd.toml is a valid config, its ${...} from Secrets")
}

fn container(docs: &[Value]) -> &Value {
    let containers = kind(docs, "Deployment")["spec"]["template"]["spec"]["containers"].as_sequence().unwrap();
    containers.iter().find(|c| c["name"].as_str() == Some("outboxd")).expect("an outboxd container")
}

#[test]
fn several_replicas_keep_their_state_in_the_changelog_not_on_a_volume() {
    let docs = documents();
    assert!(docs.iter().all(|d| d["kind"].as_str() != Some("PersistentVolumeClaim")));
    let deployment = kind(&docs, "Deployment");
    assert!(deployment["spec"]["replicas"].as_u64().unwrap() >= 2, "two or more replicas");
    let config = config(&docs);
    let changelog = config.store.changelog.as_ref().expect("the changelog carries the dedup state between pods");
    assert!(changelog.keys.is_some(), "the replicas sign their changelog records (store.changelog.key)");

    let mount = container(&docs)["volumeMounts"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|m| config.store.path.starts_with(m["mountPath"].as_str().unwrap()))
        .expect("store.path is on a mounted volume (the root filesystem is read-only)");
    let volumes = deployment["spec"]["template"]["spec"]["volumes"].as_sequence().unwrap();
    let volume = volumes.iter().find(|v| v["name"] == mount["name"]).expect("the store's volume");
    assert!(volume.get("emptyDir").is_some(), "the store is a cache: {volume:?}");
}

#[test]
fn probes_reach_the_open_endpoints_of_the_admin_server() {
    let docs = documents();
    let config = config(&docs);
    let listen = config.admin.listen.expect("the admin server is on");
    assert!(listen.ip().is_unspecified(), "the kubelet probes the pod IP, not loopback: {listen}");
    assert!(config.admin.token.is_some(), "a non-loopback store API needs a token");

    let container = container(&docs);
    let port = container["ports"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|p| p["containerPort"].as_u64() == Some(u64::from(listen.port())))
        .expect("the admin port is a container port");
    for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        let get = &container[probe]["httpGet"];
        assert_eq!(get["path"].as_str(), Some(path), "{probe}");
        assert_eq!(get["port"], port["name"], "{probe} uses the admin port");
    }
    // Connections that take every admin slot (idle, half-sent) are closed within the
    // head timeout: the liveness probe must tolerate failures longer than that, or a
    // flood at the open port would get the pod restarted.
    let liveness = &container["livenessProbe"];
    let period = liveness["periodSeconds"].as_u64().unwrap_or(10);
    let tolerated = std::time::Duration::from_secs(period * liveness["failureThreshold"].as_u64().unwrap_or(3));
    assert!(
        tolerated > config.admin.limits.header_timeout * 2,
        "liveness gives up after {tolerated:?}; admin.header_timeout is {:?}",
        config.admin.limits.header_timeout
    );
    let token = &container["env"].as_sequence().unwrap()[0];
    assert_eq!(token["name"].as_str(), Some("OUTBOXD_ADMIN_TOKEN"));
    assert!(token["valueFrom"]["secretKeyRef"].is_mapping(), "the token comes from a Secret, not the manifest");
}

#[test]
fn a_drain_ends_before_the_kubelet_kills_and_one_pod_leaves_at_a_time() {
    let docs = documents();
    let config = config(&docs);
    let deployment = kind(&docs, "Deployment");
    let grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"].as_u64().unwrap();
    assert!(
        config.kafka.drain_timeout.as_secs() + 10 <= grace,
        "drain_timeout {:?} must end well before the grace period ({grace} s)",
        config.kafka.drain_timeout
    );
    assert_eq!(deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"].as_u64(), Some(0));

    let pdb = kind(&docs, "PodDisruptionBudget");
    assert_eq!(pdb["spec"]["maxUnavailable"].as_u64(), Some(1));
    assert_eq!(pdb["spec"]["selector"], deployment["spec"]["selector"], "the budget covers the Deployment's pods");
    let labels = &deployment["spec"]["template"]["metadata"]["labels"];
    for (k, v) in deployment["spec"]["selector"]["matchLabels"].as_mapping().unwrap() {
        assert_eq!(&labels[k.as_str().unwrap()], v, "the pods carry the selector's labels");
    }
}
