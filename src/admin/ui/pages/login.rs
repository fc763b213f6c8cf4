//! The login page (the form; the login itself is `ui::login`).

use askama::Template;
use askama_web::WebTemplate;
use axum::extract::Query;
use serde::Deserialize;

#[derive(Template, WebTemplate)]
#[template(path = "ui/login.html")]
pub struct LoginPage {
    pub error: Option<String>,
    pub next: String,
}

#[derive(Deserialize)]
pub struct LoginQuery {
    #[serde(default)]
    next: String,
}

pub async fn login_page(Query(q): Query<LoginQuery>) -> LoginPage {
    LoginPage { error: None, next: q.next }
}
