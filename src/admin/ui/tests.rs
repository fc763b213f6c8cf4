use axum::http::{HeaderMap, HeaderValue, Method};

use super::super::auth::{Access, Credential, Guard};
use super::console::session_cookie;
use super::refusal;

fn guard() -> Guard {
    let admin = ("t0ken-t0ken-t0ken".to_owned(), Credential::new("admin", Access::Operate));
    Guard::new([admin], "127.0.0.1:9464".parse().unwrap(), &[], super::super::failures::Failures::new(10, 60))
}

fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.append(*k, HeaderValue::from_str(v).unwrap());
    }
    h
}

#[test]
fn pages_need_a_known_host_and_changes_need_this_origin() {
    let g = guard();
    let ok = headers(&[("host", "127.0.0.1:9464")]);
    assert_eq!(refusal(&g, &Method::GET, &ok), None);
    assert!(refusal(&g, &Method::GET, &headers(&[("host", "evil.example:9464")])).is_some(), "DNS rebinding");
    assert!(refusal(&g, &Method::GET, &HeaderMap::new()).is_some(), "no Host");
    // A POST: from this origin only.
    let same = headers(&[("host", "127.0.0.1:9464"), ("sec-fetch-site", "same-origin")]);
    assert_eq!(refusal(&g, &Method::POST, &same), None);
    let other_port = headers(&[("host", "127.0.0.1:9464"), ("sec-fetch-site", "same-site")]);
    assert!(
        refusal(&g, &Method::POST, &other_port).is_some(),
        "another port of the same host is same-site, not same-origin"
    );
    let origin = headers(&[("host", "127.0.0.1:9464"), ("origin", "http://127.0.0.1:9464")]);
    assert_eq!(refusal(&g, &Method::POST, &origin), None);
    let wrong = headers(&[("host", "127.0.0.1:9464"), ("origin", "http://127.0.0.1:8080")]);
    assert!(refusal(&g, &Method::POST, &wrong).is_some(), "wrong Origin");
    assert!(refusal(&g, &Method::POST, &ok).is_some(), "neither header: not from a page");
}

#[test]
fn the_session_cookie_is_found_among_others() {
    let h = headers(&[("cookie", "a=1; outboxd_session=abc; b=2")]);
    assert_eq!(session_cookie(&h), Some("abc"));
    assert_eq!(session_cookie(&headers(&[("cookie", "outboxd_sessionx=1")])), None);
    assert_eq!(session_cookie(&HeaderMap::new()), None);
}
