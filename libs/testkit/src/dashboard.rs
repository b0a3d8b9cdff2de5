//! What the Grafana dashboard's tests share: reading a `/metrics` page's
//! declared families and the series Prometheus stores for them, and the
//! dashboard's panels with the `runyard_*` series each queries. Each
//! service's test checks its own families both ways (every panel series
//! exposed, every family on a panel).

use std::collections::BTreeMap;

/// The metric families a `/metrics` page declares (`# TYPE name type`):
/// family → type.
pub fn declared(page: &str) -> BTreeMap<String, String> {
    page.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .map(|(name, kind)| (name.to_owned(), kind.to_owned()))
        .collect()
}

/// The series names Prometheus stores for a family of this type.
pub fn series_of(family: &str, kind: &str) -> Vec<String> {
    match kind {
        "counter" => vec![format!("{family}_total")],
        "histogram" => ["_bucket", "_sum", "_count"]
            .iter()
            .map(|s| format!("{family}{s}"))
            .collect(),
        _ => vec![family.to_owned()],
    }
}

/// Every series of `declared` families: series → family.
pub fn exposed(declared: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    declared
        .iter()
        .flat_map(|(family, kind)| {
            series_of(family, kind)
                .into_iter()
                .map(move |s| (s, family.clone()))
        })
        .collect()
}

/// Every `runyard_...` series name a PromQL expression mentions.
pub fn series_in(expr: &str) -> Vec<&str> {
    expr.match_indices("runyard_")
        .map(|(at, _)| {
            let rest = &expr[at..];
            let end = rest
                .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
                .unwrap_or(rest.len());
            &rest[..end]
        })
        .collect()
}

/// `deploy/grafana/dashboards/runyard.json` (from the workspace root).
pub fn dashboard() -> serde_json::Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/grafana/dashboards/runyard.json"
    );
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Each panel of the dashboard (rows left out): its title and the
/// expressions of its queries.
pub fn panels(dashboard: &serde_json::Value) -> Vec<(String, Vec<String>)> {
    dashboard["panels"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["type"] != "row")
        .map(|p| {
            let title = p["title"].as_str().unwrap_or_default().to_owned();
            let exprs = p["targets"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|t| t["expr"].as_str().map(str::to_owned))
                .collect();
            (title, exprs)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_become_the_series_prometheus_stores() {
        let page = "# TYPE runyard_a counter\n# TYPE runyard_b histogram\n# TYPE runyard_c gauge\n";
        let exposed = exposed(&declared(page));
        for s in [
            "runyard_a_total",
            "runyard_b_bucket",
            "runyard_b_sum",
            "runyard_b_count",
            "runyard_c",
        ] {
            assert!(exposed.contains_key(s), "{s}");
        }
        assert_eq!(
            series_in("sum(rate(runyard_a_total[5m])) / runyard_c{x=\"y\"}"),
            ["runyard_a_total", "runyard_c"]
        );
    }
}
