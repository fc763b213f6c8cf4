//! The registry client against a stand-in registry on 127.0.0.1 that answers
//! what a test tells it to.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Value};

use super::*;

/// Serves `router` on a free loopback port; returns `host:port`.
async fn serve(router: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await });
    addr.to_string()
}

/// A loopback address that refuses connections while the returned socket lives: bound,
/// never listened on, without `SO_REUSEADDR`, so the stand-in registries the other tests
/// serve on `127.0.0.1:0` meanwhile cannot be given its port (as they could one bound and
/// closed again). The integration tests' `harness::ports::ClosedPort` is its twin there.
fn refusing() -> (tokio::net::TcpSocket, std::net::SocketAddr) {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(([127, 0, 0, 1], 0).into()).unwrap();
    let addr = socket.local_addr().unwrap();
    (socket, addr)
}

fn options(url: String) -> RegistryOptions {
    RegistryOptions {
        url: Some(url),
        username: None,
        password: None,
        ca_file: None,
        timeout: Duration::from_secs(5),
        cache_dir: None,
        schemas_dir: None,
        max_allocation_bytes: 16 << 20,
        check_subjects: true,
    }
}

/// A registry that answers every schema lookup with `status` and `body`.
async fn answering(status: StatusCode, body: &'static str) -> String {
    serve(Router::new().route("/schemas/ids/{id}", get(move || async move { (status, body).into_response() }))).await
}

#[tokio::test]
async fn refused_credentials_are_an_operator_error_that_waits_and_names_the_status() {
    for status in [StatusCode::UNAUTHORIZED, StatusCode::FORBIDDEN] {
        let addr = answering(status, r#"{"error_code":40101,"message":"Unauthorized"}"#).await;
        let registry = Registry::new(options(format!("http://reader:s3cret@{addr}"))).unwrap();
        let e = registry.schema(1, "orders", Part::Value).await.unwrap_err();
        assert!(matches!(e, AvroError::Registry { fault: RegistryFault::Auth, .. }), "{e:?}");
        assert!(e.is_transient() && e.needs_operator(), "{e:?}: not dead-lettered, but loud");
        assert_eq!(e.registry_reason(), Some("auth"));
        let text = e.to_string();
        assert!(text.contains(&status.as_u16().to_string()) && text.contains("credentials"), "{text}");
        assert!(!text.contains("s3cret") && !text.contains("reader"), "credentials leak: {text}");
    }
}

#[tokio::test]
async fn an_answer_that_is_not_a_registrys_is_an_operator_error_not_an_outage() {
    let addr = answering(StatusCode::OK, "<html>Welcome to nginx!</html>").await;
    let e =
        Registry::new(options(format!("http://{addr}"))).unwrap().schema(1, "orders", Part::Value).await.unwrap_err();
    assert!(matches!(e, AvroError::Registry { fault: RegistryFault::Unparsable, .. }), "{e:?}");
    assert!(e.needs_operator() && e.is_transient());
    assert_eq!(e.registry_reason(), Some("unparsable"));
    let addr = answering(StatusCode::BAD_REQUEST, "{}").await;
    let e =
        Registry::new(options(format!("http://{addr}"))).unwrap().schema(1, "orders", Part::Value).await.unwrap_err();
    assert!(matches!(e, AvroError::Registry { fault: RegistryFault::Status, .. }), "{e:?}");
    assert!(e.to_string().contains("400"), "{e}");
}

#[tokio::test]
async fn an_endless_answer_is_cut_off_as_not_a_registrys() {
    let huge: &'static str = Box::leak(format!("{{\"schema\": \"{}\"}}", "x".repeat(9 << 20)).into_boxed_str());
    let addr = answering(StatusCode::OK, huge).await;
    let e =
        Registry::new(options(format!("http://{addr}"))).unwrap().schema(1, "orders", Part::Value).await.unwrap_err();
    assert!(
        matches!(&e, AvroError::Registry { fault: RegistryFault::Unparsable, detail } if detail.contains("larger than")),
        "{e:?}"
    );
}

#[tokio::test]
async fn an_outage_heals_by_waiting_and_never_shows_the_credentials() {
    let addr = answering(StatusCode::SERVICE_UNAVAILABLE, "").await;
    let e = Registry::new(options(format!("http://reader:s3cret@{addr}")))
        .unwrap()
        .schema(1, "orders", Part::Value)
        .await
        .unwrap_err();
    assert!(matches!(e, AvroError::Unavailable(_)) && !e.needs_operator(), "{e:?}");
    assert!(e.to_string().contains("503") && !e.to_string().contains("s3cret"), "{e}");
    // Nothing listens there: the transport error names the URL without credentials.
    let (_held, closed) = refusing();
    let e = Registry::new(options(format!("http://reader:s3cret@{closed}")))
        .unwrap()
        .schema(1, "orders", Part::Value)
        .await
        .unwrap_err();
    assert!(matches!(e, AvroError::Unavailable(_)), "{e:?}");
    let text = e.to_string();
    assert!(text.contains(&closed.to_string()) && !text.contains("s3cret") && !text.contains("reader"), "{text}");
}

#[tokio::test]
async fn an_unknown_id_is_not_waited_for() {
    let addr = answering(StatusCode::NOT_FOUND, r#"{"error_code":40403}"#).await;
    let e =
        Registry::new(options(format!("http://{addr}"))).unwrap().schema(7, "orders", Part::Value).await.unwrap_err();
    assert_eq!(e, AvroError::UnknownSchema(7));
    assert!(!e.is_transient());
}

const ORDER: &str = r#"{"type":"record","name":"Order","namespace":"shop","fields":[{"name":"n","type":"long"}]}"#;

/// A registry that knows schema id 1 (`ORDER`) and lists `subjects` for it
/// (`None`: it has no such endpoint and answers 404).
async fn with_subjects(subjects: Arc<Mutex<Option<Vec<&'static str>>>>) -> String {
    let versions = move || {
        let subjects = subjects.lock().unwrap().clone();
        async move {
            match subjects {
                Some(s) => {
                    let list: Vec<Value> = s.iter().map(|s| json!({"subject": s, "version": 1})).collect();
                    Json(Value::Array(list)).into_response()
                }
                None => (StatusCode::NOT_FOUND, "no such resource").into_response(),
            }
        }
    };
    let router = Router::new()
        .route("/schemas/ids/1", get(|| async { Json(json!({"schema": ORDER})) }))
        .route("/schemas/ids/1/versions", get(versions));
    serve(router).await
}

fn subjects(list: Option<Vec<&'static str>>) -> Arc<Mutex<Option<Vec<&'static str>>>> {
    Arc::new(Mutex::new(list))
}

#[tokio::test]
async fn a_schema_id_of_another_topics_subject_is_refused() {
    let addr = with_subjects(subjects(Some(vec!["payments-value"]))).await;
    let registry = Registry::new(options(format!("http://{addr}"))).unwrap();
    let e = registry.schema(1, "orders", Part::Value).await.unwrap_err();
    assert!(matches!(&e, AvroError::WrongSubject { id: 1, subject, .. } if subject == "orders-value"), "{e:?}");
    assert!(!e.is_transient(), "a wrong schema id is the event's fault: dead letter");
    assert!(e.to_string().contains("payments-value") && e.to_string().contains("check_subjects"), "{e}");
    assert!(registry.schema(1, "payments", Part::Value).await.is_ok());
    assert!(registry.schema(1, "payments", Part::Key).await.is_err(), "a value schema is not a key schema");
}

#[tokio::test]
async fn key_and_topic_record_name_subjects_are_accepted() {
    let addr = with_subjects(subjects(Some(vec!["orders-key", "audit-shop.Order"]))).await;
    let registry = Registry::new(options(format!("http://{addr}"))).unwrap();
    assert!(registry.schema(1, "orders", Part::Key).await.is_ok());
    assert!(registry.schema(1, "audit", Part::Value).await.is_ok(), "TopicRecordNameStrategy");
    assert!(registry.schema(1, "orders", Part::Value).await.is_err());
}

#[tokio::test]
async fn a_subject_registered_after_the_first_lookup_is_seen() {
    let list = subjects(Some(vec!["payments-value"]));
    let addr = with_subjects(list.clone()).await;
    let registry = Registry::new(options(format!("http://{addr}"))).unwrap();
    assert!(registry.schema(1, "orders", Part::Value).await.is_err());
    // The same schema registered under orders-value keeps its id.
    *list.lock().unwrap() = Some(vec!["payments-value", "orders-value"]);
    assert!(registry.schema(1, "orders", Part::Value).await.is_ok());
}

#[tokio::test]
async fn a_registry_that_cannot_list_subjects_or_a_disabled_check_accepts_any_topic() {
    let addr = with_subjects(subjects(None)).await;
    let registry = Registry::new(options(format!("http://{addr}"))).unwrap();
    assert!(registry.schema(1, "orders", Part::Value).await.is_ok());
    let addr = with_subjects(subjects(Some(vec!["payments-value"]))).await;
    let unchecked = Registry::new(RegistryOptions { check_subjects: false, ..options(format!("http://{addr}")) });
    assert!(unchecked.unwrap().schema(1, "orders", Part::Value).await.is_ok());
}

#[tokio::test]
async fn known_subjects_survive_a_restart_with_the_registry_down() {
    let cache = tempfile::tempdir().unwrap();
    let addr = with_subjects(subjects(Some(vec!["orders-value"]))).await;
    let opts = |url: String| RegistryOptions { cache_dir: Some(cache.path().to_owned()), ..options(url) };
    assert!(Registry::new(opts(format!("http://{addr}"))).unwrap().schema(1, "orders", Part::Value).await.is_ok());
    let (_held, closed) = refusing();
    let restarted = Registry::new(opts(format!("http://{closed}"))).unwrap();
    assert!(restarted.schema(1, "orders", Part::Value).await.is_ok(), "decodes from the disk cache");
    // Another topic needs the registry to ask again: it waits, it is not accepted.
    let e = restarted.schema(1, "payments", Part::Value).await.unwrap_err();
    assert!(matches!(e, AvroError::Unavailable(_)), "{e:?}");
}
