//! The registry client against a stand-in registry on 127.0.0.1 that answers
//! what a test tells it to.

use std::time::Duration;

use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;

use super::*;

/// Serves `router` on a free loopback port; returns `host:port`.
async fn serve(router: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await });
    addr.to_string()
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
        let e = registry.schema(1).await.unwrap_err();
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
    let e = Registry::new(options(format!("http://{addr}"))).unwrap().schema(1).await.unwrap_err();
    assert!(matches!(e, AvroError::Registry { fault: RegistryFault::Unparsable, .. }), "{e:?}");
    assert!(e.needs_operator() && e.is_transient());
    assert_eq!(e.registry_reason(), Some("unparsable"));
    let addr = answering(StatusCode::BAD_REQUEST, "{}").await;
    let e = Registry::new(options(format!("http://{addr}"))).unwrap().schema(1).await.unwrap_err();
    assert!(matches!(e, AvroError::Registry { fault: RegistryFault::Status, .. }), "{e:?}");
    assert!(e.to_string().contains("400"), "{e}");
}

#[tokio::test]
async fn an_outage_heals_by_waiting_and_never_shows_the_credentials() {
    let addr = answering(StatusCode::SERVICE_UNAVAILABLE, "").await;
    let e = Registry::new(options(format!("http://reader:s3cret@{addr}"))).unwrap().schema(1).await.unwrap_err();
    assert!(matches!(e, AvroError::Unavailable(_)) && !e.needs_operator(), "{e:?}");
    assert!(e.to_string().contains("503") && !e.to_string().contains("s3cret"), "{e}");
    // Nothing listens there: the transport error names the URL without credentials.
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap();
    let e = Registry::new(options(format!("http://reader:s3cret@{closed}"))).unwrap().schema(1).await.unwrap_err();
    assert!(matches!(e, AvroError::Unavailable(_)), "{e:?}");
    let text = e.to_string();
    assert!(text.contains(&closed.to_string()) && !text.contains("s3cret") && !text.contains("reader"), "{text}");
}

#[tokio::test]
async fn an_unknown_id_is_not_waited_for() {
    let addr = answering(StatusCode::NOT_FOUND, r#"{"error_code":40403}"#).await;
    let e = Registry::new(options(format!("http://{addr}"))).unwrap().schema(7).await.unwrap_err();
    assert_eq!(e, AvroError::UnknownSchema(7));
    assert!(!e.is_transient());
}
