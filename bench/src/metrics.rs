//! Reading a service's Prometheus text exposition (`/metrics`).

use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, StatusCode};

use crate::http::{HttpClient, send};

/// `GET http://127.0.0.1:<port>/metrics` (within 2 s): the exposition.
pub async fn scrape(client: &HttpClient, port: u16) -> anyhow::Result<String> {
    let req =
        Request::get(format!("http://127.0.0.1:{port}/metrics")).body(Full::new(Bytes::new()))?;
    match send(client, req, Duration::from_secs(2)).await {
        Ok((StatusCode::OK, body)) => Ok(String::from_utf8_lossy(&body).into_owned()),
        Ok((status, _)) => anyhow::bail!("/metrics answered {status}"),
        Err(e) => anyhow::bail!("/metrics: {e}"),
    }
}

/// The value of the first sample of metric `name` whose labels include
/// every one of `labels` (each written as in the exposition,
/// `op="create"`).
pub fn sample(text: &str, name: &str, labels: &[&str]) -> Option<f64> {
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(name)?;
        let (set, value) = match rest.strip_prefix('{') {
            Some(rest) => rest.split_once("} ")?,
            None => ("", rest.strip_prefix(' ')?),
        };
        let has = |l: &&str| set.split(',').any(|pair| pair == *l);
        if !labels.iter().all(has) {
            return None;
        }
        value.split_whitespace().next()?.parse().ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_samples_by_name_and_labels() {
        let text = "# HELP x_total A counter.\n\
                    x_total{result=\"applied\"} 12\n\
                    x_total{result=\"skipped\",pool=\"a\"} 3\n\
                    x_total_other 9\n\
                    lease_held{pool=\"bench\"} 1\n\
                    plain 4.5\n";
        assert_eq!(sample(text, "x_total", &["result=\"applied\""]), Some(12.0));
        assert_eq!(sample(text, "x_total", &["pool=\"a\""]), Some(3.0));
        assert_eq!(sample(text, "x_total", &["result=\"none\""]), None);
        assert_eq!(sample(text, "lease_held", &["pool=\"bench\""]), Some(1.0));
        assert_eq!(sample(text, "plain", &[]), Some(4.5));
        assert_eq!(sample(text, "x_total_other", &[]), Some(9.0));
        assert_eq!(sample(text, "missing", &[]), None);
    }
}
