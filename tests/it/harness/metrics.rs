//! The Prometheus metrics of a running outboxd (`/metrics` on its admin API, open).

use super::Outboxd;

/// How long one scrape may take.
const SCRAPE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// `/metrics` of the running service; `None` while it does not answer yet (or the
/// owner file still names an earlier run's address).
pub async fn try_scrape(od: &Outboxd) -> Option<String> {
    let owner = std::fs::read_to_string(od.config.store_path.join("outboxd.owner")).ok()?;
    let owner: serde_json::Value = serde_json::from_str(&owner).ok()?;
    let url = format!("http://{}/metrics", owner["admin"].as_str()?);
    let client = reqwest::Client::builder().timeout(SCRAPE_TIMEOUT).build().ok()?;
    let resp = client.get(url).send().await.ok()?;
    if !resp.status().is_success() {
        return None;
    }
    resp.text().await.ok()
}

/// The sum of the samples of metric `name` whose labels include `labels`.
pub fn sample(metrics: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    metrics
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
        .filter(|l| labels.iter().all(|(k, v)| l.contains(&format!("{k}=\"{v}\""))))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}
