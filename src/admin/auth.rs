//! The one door of the store API (`/v1/*`): a layer that refuses browser
//! requests from other origins and unexpected `Host` headers (DNS rebinding),
//! then requires a bearer token, finds whose it is (a [`Credential`], put into
//! the request's extensions for the audit), and refuses a change (any method but
//! `GET` and `HEAD`) by a credential that may only read, auditing the refusal.
//! A wrong token counts against the limits on failed credentials (`failures`); a
//! right one is never refused for others' failures. `/healthz`, `/readyz` and
//! `/metrics` do not pass through it.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::{ConditionallySelectable, ConstantTimeEq};

use super::error::ApiError;
use super::failures::{Failures, Limited};
pub use crate::config::Access;
use crate::ops::{Actor, Local};
use crate::store::AuditAction;

/// Who a request comes from: the name of the credential its bearer token is
/// (`admin` for `[admin] token`, `local` for the per-run token of the owner file,
/// or an `[[admin.tokens]]` name), and what that credential may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credential {
    /// The credential's name, as the audit shows it.
    pub name: String,
    /// What it may do.
    pub access: Access,
}

impl Credential {
    /// The credential `name` with `access`.
    pub fn new(name: impl Into<String>, access: Access) -> Credential {
        Credential { name: name.into(), access }
    }

    /// May it change the store (forget, resolve, retry, gc)?
    pub fn may_operate(&self) -> bool {
        self.access == Access::Operate
    }
}

/// What the store API accepts, fixed when the server starts.
pub struct Guard {
    /// Accepted bearer tokens and whose they are: `[admin] token`, `[[admin.tokens]]`
    /// and this run's token from the owner file. Tokens are never logged.
    tokens: Vec<(String, Credential)>,
    /// Accepted `Host` values (lower case).
    hosts: Hosts,
    /// Wrong credentials so far, per address and in all (`/v1` and the console's login).
    failures: Failures,
    /// Where a refused repair is audited (`None` in tests of the checks alone).
    audit: Option<Local>,
}

/// `Host` values that name this server: its listen address, the loopback
/// names with its port, and `[admin] allowed_hosts`.
struct Hosts {
    port: u16,
    /// Names that pass with this server's port: the listen IP and the loopback names.
    own: Vec<String>,
    /// `[admin] allowed_hosts` entries with a port, compared whole.
    exact: Vec<String>,
    /// `[admin] allowed_hosts` entries without a port: any port (or none) passes.
    any_port: Vec<String>,
}

impl Hosts {
    fn allows(&self, host: &str) -> bool {
        let host = host.to_ascii_lowercase();
        let (name, port) = split_port(&host);
        // A Host without a port means the scheme's default (80 for http).
        let port = port.map_or(Some(80), |p| p.parse::<u16>().ok());
        (port == Some(self.port) && self.own.iter().any(|o| o == name))
            || self.exact.contains(&host)
            || self.any_port.iter().any(|a| a == name)
    }
}

impl Guard {
    /// Accepts `tokens` (empty ones never), for a server on `listen`, answering 429
    /// past `failures` wrong credentials.
    pub fn new(
        tokens: impl IntoIterator<Item = (String, Credential)>,
        listen: SocketAddr,
        allowed_hosts: &[String],
        failures: Failures,
    ) -> Guard {
        let listen_ip = match listen {
            SocketAddr::V4(a) => a.ip().to_string(),
            SocketAddr::V6(a) => format!("[{}]", a.ip()),
        };
        let own = vec![listen_ip, "localhost".into(), "127.0.0.1".into(), "[::1]".into()];
        let (mut exact, mut any_port) = (Vec::new(), Vec::new());
        for h in allowed_hosts {
            let h = h.to_ascii_lowercase();
            match split_port(&h) {
                (_, Some(_)) => exact.push(h),
                (_, None) => any_port.push(h),
            }
        }
        let tokens = tokens.into_iter().filter(|(t, _)| !t.is_empty()).collect();
        Guard { tokens, hosts: Hosts { port: listen.port(), own, exact, any_port }, failures, audit: None }
    }

    /// Refused repairs are audited on `local`'s store.
    pub fn auditing(mut self, local: Local) -> Guard {
        self.audit = Some(local);
        self
    }

    /// A wrong credential from `peer`: within the limits, `Ok` (answer 401); past
    /// one, the limit (answer 429).
    pub(super) fn failed(&self, peer: IpAddr) -> Result<(), Limited> {
        self.failures.failed(peer)
    }

    /// The credential whose token `given` is, if any. Every accepted token is
    /// compared, each in the same time whatever bytes match, and which one matched
    /// is selected without a branch, so response times reveal neither a prefix nor
    /// which credential it was; only whether a length is right can be learnt (the
    /// per-run token's length is public anyway). The console's login uses it too.
    pub(super) fn credential_for(&self, given: &str) -> Option<Credential> {
        let (mut ok, mut index) = (subtle::Choice::from(0), 0u32);
        for (i, (t, _)) in self.tokens.iter().enumerate() {
            let eq = given.as_bytes().ct_eq(t.as_bytes());
            index.conditional_assign(&(i as u32), eq);
            ok |= eq;
        }
        bool::from(ok).then(|| self.tokens[index as usize].1.clone())
    }

    #[cfg(test)]
    fn accepts(&self, given: &str) -> bool {
        self.credential_for(given).is_some()
    }

    pub(super) fn host_allowed(&self, host: &str) -> bool {
        self.hosts.allows(host)
    }

    /// Refuses a request that a browser made for another site's page, or that
    /// came through a name this server does not answer to; `None` lets it through.
    fn refusal(&self, headers: &HeaderMap, authority: Option<&str>) -> Option<ApiError> {
        if headers.contains_key(header::ORIGIN) {
            return Some(ApiError(
                StatusCode::FORBIDDEN,
                "cross-origin requests are refused: the store API is not for browsers (the request has an Origin header)"
                    .into(),
            ));
        }
        let site = headers.get("sec-fetch-site").and_then(|v| v.to_str().ok());
        if site.is_some_and(|s| s.eq_ignore_ascii_case("cross-site") || s.eq_ignore_ascii_case("same-site")) {
            return Some(ApiError(
                StatusCode::FORBIDDEN,
                "cross-site requests are refused: the store API is not for browsers (Sec-Fetch-Site)".into(),
            ));
        }
        let host = headers.get(header::HOST).and_then(|v| v.to_str().ok()).or(authority);
        match host {
            Some(h) if self.host_allowed(h) => None,
            Some(_) => Some(ApiError(
                StatusCode::FORBIDDEN,
                "unexpected Host header: call the listen address, localhost or 127.0.0.1, or add the name to [admin] allowed_hosts"
                    .into(),
            )),
            None => Some(ApiError(StatusCode::FORBIDDEN, "a Host header is required".into())),
        }
    }

    /// The request's credential; `Err(true)` when it carries a wrong one, `Err(false)`
    /// when none.
    fn credential(&self, headers: &HeaderMap) -> Result<Credential, bool> {
        let given = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")));
        match given.map(|t| self.credential_for(t)) {
            None => Err(false),
            Some(Some(credential)) => Ok(credential),
            Some(None) => Err(true),
        }
    }
}

/// What the store API asks for, in the answer to a request without a right credential.
const NEEDS: &str = "the store API needs Authorization: Bearer <token>: the token in the store's owner file \
                     (outboxd.owner, readable by the user running outboxd) or [admin] token";

/// 401 for a request without a right credential; 429 once wrong ones came too often.
fn unauthorized(wrong: bool, limited: Option<Limited>) -> Response {
    let e = match (wrong, limited) {
        (_, Some(l)) => ApiError(
            StatusCode::TOO_MANY_REQUESTS,
            format!(
                "too many wrong credentials ({}); wait a minute (a right credential is still accepted)",
                match l {
                    Limited::Address => "from this address",
                    Limited::Total => "from all addresses",
                }
            ),
        ),
        (true, None) => ApiError(StatusCode::UNAUTHORIZED, format!("wrong credential: {NEEDS}")),
        (false, None) => ApiError(StatusCode::UNAUTHORIZED, format!("missing credential: {NEEDS}")),
    };
    let mut resp = e.into_response();
    resp.headers_mut().insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static("Bearer"));
    resp
}

/// The client's address (unspecified when the server did not say: tests of the router alone).
pub(super) fn peer_of(req: &Request) -> IpAddr {
    req.extensions().get::<ConnectInfo<SocketAddr>>().map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |c| c.0.ip())
}

/// The repair a `/v1` path asks for.
fn action_of(path: &str) -> Option<AuditAction> {
    match path.trim_end_matches('/') {
        "/forget" => Some(AuditAction::Forget),
        "/resolve" => Some(AuditAction::Resolve),
        "/retry" => Some(AuditAction::Retry),
        "/gc" => Some(AuditAction::Gc),
        "/replay" => Some(AuditAction::Replay),
        _ => None,
    }
}

/// Audits a repair refused to `credential` (read access), with the event and the
/// reason the request named. Runs to its end even if the client goes away.
async fn audit_refusal(local: &Local, credential: &Credential, uri: &axum::http::Uri) {
    let Some(action) = action_of(uri.path()) else { return };
    let query: Vec<(String, String)> =
        uri.query().map(|q| url::form_urlencoded::parse(q.as_bytes()).into_owned().collect()).unwrap_or_default();
    let named = |key: &str| query.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone());
    let ids: Vec<String> = named("id").into_iter().collect();
    // A reason the repair would have refused (too long, not text) is left out, not the entry.
    let actor = Actor::new(&credential.name, named("reason").as_deref())
        .unwrap_or_else(|_| Actor { name: credential.name.clone(), reason: None });
    let local = local.clone();
    let _ = tokio::spawn(async move { local.refused_by(action, &ids, &actor, "the credential has read access").await })
        .await;
}

/// A change (forget, resolve, retry, gc: every method but `GET` and `HEAD`) by a
/// credential that may only read: 403, saying so.
fn refused_change(method: &Method, credential: &Credential) -> Option<ApiError> {
    let reads = *method == Method::GET || *method == Method::HEAD;
    (!reads && !credential.may_operate()).then(|| {
        ApiError(
            StatusCode::FORBIDDEN,
            format!(
                "credential {:?} has read access: it may look, not change the store (forget, resolve, retry and gc \
                 need a credential with access = \"operate\")",
                credential.name
            ),
        )
    })
}

/// The layer on `/v1`: 403 for browsers and foreign `Host`s, 401 without an
/// accepted token, 403 for a change by a read credential; a request let through
/// carries its [`Credential`] in its extensions.
pub async fn check(State(guard): State<Arc<Guard>>, mut req: Request, next: Next) -> Response {
    let authority = req.uri().authority().map(|a| a.as_str().to_owned());
    if let Some(refused) = guard.refusal(req.headers(), authority.as_deref()) {
        tracing::warn!(path = req.uri().path(), reason = %refused.1, "admin request refused");
        return refused.into_response();
    }
    let credential = match guard.credential(req.headers()) {
        Ok(credential) => credential,
        Err(false) => {
            tracing::warn!(path = req.uri().path(), "admin request refused: no credential");
            return unauthorized(false, None);
        }
        Err(true) => {
            let peer = peer_of(&req);
            let limited = guard.failed(peer).err();
            if limited.is_none() {
                tracing::warn!(path = req.uri().path(), client = %peer, "admin request refused: wrong credential");
            }
            return unauthorized(true, limited);
        }
    };
    if let Some(refused) = refused_change(req.method(), &credential) {
        tracing::warn!(path = req.uri().path(), credential = %credential.name, reason = %refused.1, "admin request refused");
        if let Some(local) = &guard.audit {
            let uri = req.uri().clone();
            audit_refusal(local, &credential, &uri).await;
        }
        return refused.into_response();
    }
    req.extensions_mut().insert(credential);
    next.run(req).await
}

/// `host:port` → (`host`, `Some(port)`); an IPv6 literal keeps its brackets.
fn split_port(host: &str) -> (&str, Option<&str>) {
    match host.rsplit_once(':') {
        Some((h, p))
            if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) && (!h.contains(':') || h.ends_with(']')) =>
        {
            (h, Some(p))
        }
        _ => (host, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RUN: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

    fn operate(name: &str) -> Credential {
        Credential::new(name, Access::Operate)
    }

    fn run_token() -> (String, Credential) {
        (RUN.to_owned(), operate("local"))
    }

    fn guard(configured: Option<&str>, allowed: &[&str]) -> Guard {
        let tokens = configured.into_iter().map(|t| (t.to_owned(), operate("admin"))).chain([run_token()]);
        let allowed: Vec<String> = allowed.iter().map(|s| s.to_string()).collect();
        Guard::new(tokens, "127.0.0.1:9464".parse().unwrap(), &allowed, Failures::new(10, 60))
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
        let g = guard(Some("s3cret-configured"), &[]);
        assert!(g.accepts(RUN), "the per-run token");
        assert!(g.accepts("s3cret-configured"), "the configured token");
        assert!(!g.accepts(""), "empty");
        assert!(!g.accepts(&RUN[..63]), "a prefix");
        assert!(!g.accepts(&RUN[..1]), "one character");
        assert!(!g.accepts(&format!("{RUN}0")), "one character more");
        assert!(!g.accepts("s3cret-configureD"), "last byte wrong");
        assert!(!g.accepts(&RUN.to_uppercase()), "another case");
        let only_run = guard(None, &[]);
        assert!(!only_run.accepts("s3cret-configured"));
        assert!(
            !Guard::new([(String::new(), operate("x"))], "127.0.0.1:1".parse().unwrap(), &[], Failures::new(10, 60))
                .accepts(""),
            "an empty token is never accepted"
        );
    }

    #[test]
    fn each_token_is_the_credential_it_was_configured_as() {
        let tokens = [
            ("alice-0123456789abcdef".to_owned(), operate("alice")),
            ("bob-0123456789abcdef".to_owned(), Credential::new("bob", Access::Read)),
            run_token(),
        ];
        let g = Guard::new(tokens, "127.0.0.1:9464".parse().unwrap(), &[], Failures::new(10, 60));
        assert_eq!(g.credential_for("alice-0123456789abcdef"), Some(operate("alice")));
        assert_eq!(g.credential_for("bob-0123456789abcdef"), Some(Credential::new("bob", Access::Read)));
        assert_eq!(g.credential_for(RUN), Some(operate("local")));
        assert_eq!(g.credential_for("bob-0123456789abcde"), None);
    }

    #[test]
    fn a_read_credential_may_look_but_not_change() {
        let (read, op) = (Credential::new("bob", Access::Read), operate("alice"));
        assert!(refused_change(&Method::GET, &read).is_none());
        assert!(refused_change(&Method::HEAD, &read).is_none());
        let refused = refused_change(&Method::POST, &read).expect("a POST by a read credential");
        assert_eq!(refused.0, StatusCode::FORBIDDEN);
        assert!(refused.1.contains("\"bob\" has read access"), "{}", refused.1);
        assert!(refused_change(&Method::POST, &op).is_none());
        assert!(refused_change(&Method::DELETE, &read).is_some());
    }

    #[test]
    fn credential_is_a_bearer_authorization_header() {
        let g = guard(None, &[]);
        assert_eq!(g.credential(&headers(&[("authorization", &format!("Bearer {RUN}"))])).ok(), Some(operate("local")));
        for (h, wrong, why) in [
            (headers(&[]), false, "missing"),
            (headers(&[("authorization", RUN)]), false, "without the scheme"),
            (headers(&[("authorization", &format!("Basic {RUN}"))]), false, "another scheme"),
            (headers(&[("authorization", "Bearer ")]), true, "empty"),
            (headers(&[("authorization", "Bearer nope")]), true, "wrong"),
        ] {
            assert_eq!(g.credential(&h).expect_err(why), wrong, "{why}: a wrong token, or none");
        }
    }

    #[test]
    fn loopback_names_of_the_port_and_allowed_hosts_pass_the_host_check() {
        let g = guard(None, &["outboxd.internal", "10.0.0.7:8080"]);
        for ok in [
            "127.0.0.1:9464",
            "localhost:9464",
            "LOCALHOST:9464",
            "[::1]:9464",
            "outboxd.internal",
            "outboxd.internal:443",
            "10.0.0.7:8080",
        ] {
            assert!(g.host_allowed(ok), "{ok}");
        }
        for refused in
            ["evil.example:9464", "localhost:9465", "localhost", "127.0.0.1", "10.0.0.7:9464", "10.0.0.7", ""]
        {
            assert!(!g.host_allowed(refused), "{refused}");
        }
        let wildcard = Guard::new([run_token()], "0.0.0.0:9464".parse().unwrap(), &[], Failures::new(10, 60));
        assert!(wildcard.host_allowed("0.0.0.0:9464") && !wildcard.host_allowed("10.1.2.3:9464"));
        let on_80 = Guard::new([run_token()], "127.0.0.1:80".parse().unwrap(), &[], Failures::new(10, 60));
        assert!(on_80.host_allowed("localhost") && !on_80.host_allowed("evil.example"));
    }

    #[test]
    fn browser_requests_and_foreign_hosts_are_refused() {
        let g = guard(None, &[]);
        let local = ("host", "127.0.0.1:9464");
        assert!(g.refusal(&headers(&[local]), None).is_none());
        assert!(
            g.refusal(&headers(&[local, ("sec-fetch-site", "none")]), None).is_none(),
            "typed into the address bar"
        );
        for (h, why) in [
            (headers(&[local, ("origin", "http://evil.example")]), "Origin"),
            (headers(&[local, ("origin", "null")]), "Origin null"),
            (headers(&[local, ("sec-fetch-site", "cross-site")]), "cross-site"),
            (headers(&[local, ("sec-fetch-site", "same-site")]), "another port of localhost"),
            (headers(&[("host", "evil.example:9464")]), "rebinding"),
            (headers(&[]), "no Host"),
        ] {
            assert_eq!(g.refusal(&h, None).map(|e| e.0), Some(StatusCode::FORBIDDEN), "{why}");
        }
        assert!(g.refusal(&headers(&[]), Some("localhost:9464")).is_none(), "HTTP/2 :authority");
    }

    #[test]
    fn ports_split_off_names_and_bracketed_ipv6() {
        assert_eq!(split_port("a.b:80"), ("a.b", Some("80")));
        assert_eq!(split_port("a.b"), ("a.b", None));
        assert_eq!(split_port("[::1]:9464"), ("[::1]", Some("9464")));
        assert_eq!(split_port("[::1]"), ("[::1]", None));
        assert_eq!(split_port("a.b:"), ("a.b:", None));
    }
}
