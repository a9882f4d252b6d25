//! Reading `GET /metrics` as a scraper does.

use std::collections::BTreeMap;

use super::Client;

/// Every sample of the exposition: `name{labels}` -> value.
pub fn scrape(client: &mut Client) -> BTreeMap<String, f64> {
    let response = client.request("GET", "/metrics", &[], "").unwrap();
    assert_eq!(response.status, 200, "{response:?}");
    assert!(
        response
            .header("content-type")
            .is_some_and(|t| t.starts_with("text/plain")),
        "{response:?}"
    );
    let mut samples = BTreeMap::new();
    for line in response.body.lines() {
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').unwrap();
        samples.insert(series.to_string(), value.parse().unwrap());
    }
    samples
}

/// The sum of a metric's samples whose labels contain every one of `labels`.
pub fn sum(samples: &BTreeMap<String, f64>, name: &str, labels: &[&str]) -> f64 {
    samples
        .iter()
        .filter(|(series, _)| {
            series.split('{').next() == Some(name) && labels.iter().all(|l| series.contains(l))
        })
        .map(|(_, v)| v)
        .sum()
}
