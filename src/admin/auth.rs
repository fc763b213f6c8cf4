//! The one door of the store API (`/v1/*`): a layer that requires a bearer
//! token. `/healthz`, `/readyz` and `/metrics` do not pass through it.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

use super::ApiError;

/// What the store API accepts, fixed when the server starts.
pub struct Guard {
    /// Accepted bearer tokens: `[admin] token` and this run's token from the owner file.
    /// Never logged.
    tokens: Vec<String>,
}

impl Guard {
    pub fn new(tokens: impl IntoIterator<Item = String>) -> Guard {
        let tokens = tokens.into_iter().filter(|t| !t.is_empty()).collect();
        Guard { tokens }
    }

    /// Whether `Authorization: Bearer <given>` names an accepted token. Each
    /// comparison takes the same time whatever bytes match, so response
    /// times do not reveal a prefix; only whether the length is right can be
    /// learnt (the per-run token's length is public anyway).
    fn accepts(&self, given: &str) -> bool {
        let mut ok = subtle::Choice::from(0);
        for t in &self.tokens {
            ok |= given.as_bytes().ct_eq(t.as_bytes());
        }
        bool::from(ok)
    }

    fn credential(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        let given = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")));
        let missing = "the store API needs Authorization: Bearer <token>: the token in the store's owner file \
                       (outboxd.owner, readable by the user running outboxd) or [admin] token";
        match given {
            None => Err(ApiError(StatusCode::UNAUTHORIZED, format!("missing credential: {missing}"))),
            Some(t) if self.accepts(t) => Ok(()),
            Some(_) => Err(ApiError(StatusCode::UNAUTHORIZED, format!("wrong credential: {missing}"))),
        }
    }
}

/// The layer on `/v1`: 401 without an accepted token.
pub async fn check(State(guard): State<Arc<Guard>>, req: Request, next: Next) -> Response {
    if let Err(e) = guard.credential(req.headers()) {
        tracing::warn!(path = req.uri().path(), reason = %e.1, "admin request refused");
        let mut resp = e.into_response();
        resp.headers_mut().insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static("Bearer"));
        return resp;
    }
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;

    const RUN: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

    fn guard(configured: Option<&str>) -> Guard {
        Guard::new(configured.into_iter().map(str::to_owned).chain([RUN.to_owned()]))
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn only_a_whole_accepted_token_is_a_credential() {
        let g = guard(Some("s3cret-configured"));
        assert!(g.accepts(RUN), "the per-run token");
        assert!(g.accepts("s3cret-configured"), "the configured token");
        assert!(!g.accepts(""), "empty");
        assert!(!g.accepts(&RUN[..63]), "a prefix");
        assert!(!g.accepts(&RUN[..1]), "one character");
        assert!(!g.accepts(&format!("{RUN}0")), "one character more");
        assert!(!g.accepts("s3cret-configureD"), "last byte wrong");
        assert!(!g.accepts(&RUN.to_uppercase()), "another case");
        let only_run = guard(None);
        assert!(!only_run.accepts("s3cret-configured"));
        assert!(!Guard::new([String::new()]).accepts(""), "an empty token is never accepted");
    }

    #[test]
    fn credential_is_a_bearer_authorization_header() {
        let g = guard(None);
        assert!(g.credential(&headers(&[("authorization", &format!("Bearer {RUN}"))])).is_ok());
        for (h, why) in [
            (headers(&[]), "missing"),
            (headers(&[("authorization", RUN)]), "without the scheme"),
            (headers(&[("authorization", &format!("Basic {RUN}"))]), "another scheme"),
            (headers(&[("authorization", "Bearer ")]), "empty"),
            (headers(&[("authorization", "Bearer nope")]), "wrong"),
        ] {
            let e = g.credential(&h).expect_err(why);
            assert_eq!(e.0, StatusCode::UNAUTHORIZED, "{why}");
            assert!(!e.1.contains(RUN), "the error never shows a token");
        }
    }
}
