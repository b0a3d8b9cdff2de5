//! A keep-alive HTTP/1.1 client for driving services over loopback.

use std::borrow::Cow;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::{Request, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// The client type the benchmarks use: plain HTTP, request bodies in memory.
pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// A pooled HTTP/1.1 client keeping up to `max_idle` connections per host,
/// with `TCP_NODELAY` (small request/response exchanges must not wait for
/// Nagle's algorithm).
pub fn client(max_idle: usize) -> HttpClient {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(Duration::from_secs(5)));
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(max_idle)
        .pool_idle_timeout(Duration::from_secs(90))
        .build(connector)
}

/// Sends `req` and reads the whole response body, within `timeout`. Errors
/// are short labels suitable for a [`crate::load::Tally`].
pub async fn send(
    client: &HttpClient,
    req: Request<Full<Bytes>>,
    timeout: Duration,
) -> Result<(StatusCode, Bytes), Cow<'static, str>> {
    let exchange = async {
        let resp = client
            .request(req)
            .await
            .map_err(|e| Cow::Owned(format!("request error: {e}")))?;
        let status = resp.status();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| Cow::Owned(format!("body error: {e}")))?
            .to_bytes();
        Ok((status, body))
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| Cow::Borrowed("timeout"))?
}

/// Polls `GET url` until it answers 200, for at most `limit`.
pub async fn wait_for_200(client: &HttpClient, url: &str, limit: Duration) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + limit;
    let mut last = String::from("no answer");
    while tokio::time::Instant::now() < deadline {
        let req = Request::get(url).body(Full::new(Bytes::new()))?;
        match send(client, req, Duration::from_secs(2)).await {
            Ok((StatusCode::OK, _)) => return Ok(()),
            Ok((status, body)) => last = format!("{status}: {}", String::from_utf8_lossy(&body)),
            Err(e) => last = e.into_owned(),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    anyhow::bail!("{url} not ready within {limit:?} (last: {last})")
}
