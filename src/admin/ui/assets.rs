//! The console's static files, compiled into the binary: htmx (2.0.11, vendored
//! unchanged from its npm package; `assets/ui/htmx.LICENSE`), the style sheet and the icon.
//! Nothing is fetched from elsewhere, so the console works offline and under a CSP
//! that allows this server only.

use axum::extract::Path;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};

/// Name, content type, content.
const ASSETS: [(&str, &str, &[u8]); 3] = [
    ("htmx.min.js", "text/javascript; charset=utf-8", include_bytes!("../../../assets/ui/htmx.min.js")),
    ("console.css", "text/css; charset=utf-8", include_bytes!("../../../assets/ui/console.css")),
    ("favicon.svg", "image/svg+xml", include_bytes!("../../../assets/ui/favicon.svg")),
];

/// Assets change only with the binary: browsers may keep them an hour.
const CACHE: &str = "public, max-age=3600";

pub async fn serve(Path(name): Path<String>) -> Response {
    match ASSETS.iter().find(|(n, _, _)| *n == name) {
        Some((_, kind, body)) => {
            ([(header::CONTENT_TYPE, *kind), (header::CACHE_CONTROL, CACHE)], *body).into_response()
        }
        None => (StatusCode::NOT_FOUND, "no such asset").into_response(),
    }
}
