//! A real headless Chromium, from Debian's `chromium` and `chromium-driver`
//! packages (`scripts/setup` installs them), driven over WebDriver by
//! fantoccini. The driver is a process of its own on a free loopback port,
//! stopped by its PID when the browser is dropped.
//!
//! What the console tests ask of a page besides its content: the browser's
//! console stayed free of errors (a CSP violation is one), and axe-core
//! (vendored in `tests/it/assets`, injected by WebDriver, never served by
//! outboxd) finds nothing serious.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fantoccini::wd::WebDriverCompatibleCommand;
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{json, Value};

use super::{wait_for, wait_until_async};

/// Where Debian puts the browser and its driver.
const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
/// How long the driver may take to answer its first `/status`.
const DRIVER_START: Duration = Duration::from_secs(30);
/// How long a page may take to show what a test waits for.
pub const PAGE_TIMEOUT: Duration = Duration::from_secs(30);

/// axe-core 4.14.1, as published on npm (MPL 2.0, `axe.LICENSE`).
const AXE: &str = include_str!("../assets/axe.min.js");

pub struct Browser {
    driver: Child,
    pub client: Client,
    profile: tempfile::TempDir,
}

/// chromedriver's log endpoint (not in the W3C protocol, which fantoccini speaks).
#[derive(Debug)]
struct BrowserLog;

impl WebDriverCompatibleCommand for BrowserLog {
    fn endpoint(&self, base: &url::Url, session: Option<&str>) -> Result<url::Url, url::ParseError> {
        base.join(&format!("session/{}/se/log", session.unwrap_or_default()))
    }

    fn method_and_body(&self, _: &url::Url) -> (axum::http::Method, Option<String>) {
        (axum::http::Method::POST, Some(json!({"type": "browser"}).to_string()))
    }
}

impl Browser {
    /// Starts chromedriver and a headless Chromium session at 1280×1000.
    pub async fn start() -> Browser {
        for bin in [CHROMIUM, CHROMEDRIVER] {
            assert!(
                std::path::Path::new(bin).exists(),
                "{bin} is missing: the console tests need Debian's chromium and chromium-driver (scripts/setup installs them)"
            );
        }
        let port = super::ports::child_port();
        let driver = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .arg("--allowed-ips=127.0.0.1")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver");
        let url = format!("http://127.0.0.1:{port}");
        wait_until_async(format!("chromedriver to answer on {url}"), DRIVER_START, async || {
            reqwest::get(format!("{url}/status")).await.is_ok()
        })
        .await;
        let profile = tempfile::tempdir().expect("a browser profile directory");
        let caps = json!({
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": CHROMIUM,
                // --no-sandbox: CI runs as root, where Chromium's sandbox cannot start.
                "args": ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                         "--window-size=1280,1000", "--no-first-run", "--disable-extensions",
                         format!("--user-data-dir={}", profile.path().display())],
            },
            "goog:loggingPrefs": {"browser": "ALL"},
        });
        let Value::Object(caps) = caps else { unreachable!() };
        let client = ClientBuilder::native().capabilities(caps).connect(&url).await.expect("a Chromium session");
        Browser { driver, client, profile }
    }

    /// Opens `url` and waits until an element matches `css`.
    pub async fn open(&self, url: &str, css: &str) {
        self.client.goto(url).await.unwrap_or_else(|e| panic!("open {url}: {e}"));
        self.wait_for(css).await;
    }

    /// Waits until an element matches `css`.
    pub async fn wait_for(&self, css: &str) -> fantoccini::elements::Element {
        self.client
            .wait()
            .at_most(PAGE_TIMEOUT)
            .for_element(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("no {css} on the page within {PAGE_TIMEOUT:?}: {e}"))
    }

    /// Waits until the page's text contains `text`.
    pub async fn wait_for_text(&self, text: &str) {
        wait_for(format!("{text:?} to appear on the page"), PAGE_TIMEOUT, async || {
            let body = self.text().await;
            if body.contains(text) {
                Ok(())
            } else {
                Err(format!("the page says\n{body}"))
            }
        })
        .await;
    }

    /// The page's visible text.
    pub async fn text(&self) -> String {
        let v = self.client.execute("return document.body ? document.body.innerText : ''", vec![]).await;
        v.ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default()
    }

    /// The current address.
    pub async fn url(&self) -> url::Url {
        self.client.current_url().await.expect("the current URL")
    }

    /// Clicks the element `css` matches.
    pub async fn click(&self, css: &str) {
        self.wait_for(css).await.click().await.unwrap_or_else(|e| panic!("click {css}: {e}"));
    }

    /// Types `text` into the field `css` matches.
    pub async fn type_into(&self, css: &str, text: &str) {
        self.wait_for(css).await.send_keys(text).await.unwrap_or_else(|e| panic!("type into {css}: {e}"));
    }

    /// The browser console's messages at warning level or above since the last call.
    pub async fn console_errors(&self) -> Vec<String> {
        let log = self.client.issue_cmd(BrowserLog).await.expect("the browser's console log");
        log.as_array()
            .into_iter()
            .flatten()
            .filter(|e| matches!(e["level"].as_str(), Some("SEVERE" | "WARNING")))
            .map(|e| e["message"].as_str().unwrap_or_default().to_owned())
            .collect()
    }

    /// axe-core's violations of impact `serious` or `critical` on the current page.
    pub async fn serious_accessibility_violations(&self) -> Vec<String> {
        let script = format!(
            "{AXE}\n;const done = arguments[arguments.length - 1];\
             axe.run(document, {{resultTypes: ['violations']}}).then(r => done(r.violations.map(v => \
             ({{id: v.id, impact: v.impact, help: v.help, nodes: v.nodes.map(n => n.target.join(' ')).slice(0, 3)}})))\
             ).catch(e => done([{{id: 'axe-error', impact: 'critical', help: String(e), nodes: []}}]));"
        );
        let found = self.client.execute_async(&script, vec![]).await.expect("run axe-core");
        found
            .as_array()
            .into_iter()
            .flatten()
            .filter(|v| matches!(v["impact"].as_str(), Some("serious" | "critical")))
            .map(|v| format!("{} ({}): {} at {}", v["id"], v["impact"], v["help"], v["nodes"]))
            .collect()
    }

    /// Saves a screenshot of the page as `<name>.png` under `target/console-screenshots`.
    pub async fn screenshot(&self, name: &str) -> PathBuf {
        let png = self.client.screenshot().await.expect("a screenshot");
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/console-screenshots");
        std::fs::create_dir_all(&dir).expect("the screenshots directory");
        let path = dir.join(format!("{name}.png"));
        std::fs::write(&path, png).expect("write the screenshot");
        path
    }

    /// Ends the session and stops the driver.
    pub async fn close(mut self) {
        let _ = self.client.clone().close().await;
        self.stop_driver();
    }

    fn stop_driver(&mut self) {
        let _ = self.driver.kill();
        let _ = self.driver.wait();
        let _ = &self.profile;
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        self.stop_driver();
    }
}
