//! The exporter's HTTP client: the reqwest the service already links (rustls), so the
//! OTLP export brings no HTTP or TLS stack of its own.

use std::time::Duration;

use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};

/// Sends OTLP export requests; redirects are not followed (a collector URL that
/// redirects is a misconfiguration, and the auth headers must not go elsewhere).
#[derive(Debug, Clone)]
pub(super) struct Client(reqwest::Client);

impl Client {
    /// Each request bounded by `timeout`, connecting included.
    pub(super) fn new(timeout: Duration) -> reqwest::Result<Client> {
        reqwest::Client::builder().timeout(timeout).redirect(reqwest::redirect::Policy::none()).build().map(Client)
    }
}

#[async_trait::async_trait]
impl HttpClient for Client {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let request = reqwest::Request::try_from(request)?;
        // reqwest's errors name the URL, which may carry a secret from `${VAR}`.
        let response = self.0.execute(request).await.map_err(reqwest::Error::without_url)?;
        let mut answer = Response::builder().status(response.status().as_u16());
        for (name, value) in response.headers() {
            answer = answer.header(name.as_str(), value.as_bytes());
        }
        Ok(answer.body(response.bytes().await.map_err(reqwest::Error::without_url)?)?)
    }
}
