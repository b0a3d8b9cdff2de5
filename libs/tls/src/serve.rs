//! Serving an axum router on a [`Listener`] with the bounds a public port
//! needs and `axum::serve` does not set: a connection that does not send a
//! complete request head within `head_timeout` — one that trickles its
//! headers, or sits idle between requests — is closed, so idle or
//! half-open connections cannot pile up until the process runs out of file
//! descriptors. HTTP/2 connections are pinged and closed when they stop
//! answering. Every request carries `ConnectInfo<Peer>`.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use axum::extract::ConnectInfo;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tower::ServiceExt as _;

use crate::{Listener, Peer};

/// How long a client may take to send a request head (and how long an idle
/// connection is kept) when a service names nothing else.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves `router` on `listener` until `shutdown` resolves, then lets the
/// requests under way finish (idle connections are closed at once).
pub async fn serve(
    mut listener: Listener,
    router: axum::Router,
    head_timeout: Duration,
    shutdown: impl Future<Output = ()> + Send,
) {
    let graceful = GracefulShutdown::new();
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(head_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(head_timeout)
        .keep_alive_timeout(head_timeout);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.next() => accepted,
            () = &mut shutdown => break,
        };
        let service = router.clone().map_request(
            move |mut request: axum::http::Request<hyper::body::Incoming>| {
                request.extensions_mut().insert(ConnectInfo::<Peer>(peer));
                request.map(axum::body::Body::new)
            },
        );
        let stream = FirstBytes::new(stream, head_timeout);
        let connection = builder
            .serve_connection(TokioIo::new(stream), TowerToHyperService::new(service))
            .into_owned();
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::trace!(%error, addr = %peer.addr, "connection ended with an error");
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

/// A connection whose first bytes must come within a deadline: before a
/// request head can be timed, an HTTP server reads them to tell HTTP/1
/// from HTTP/2 (or waits for the HTTP/2 preface), and that read has no
/// bound of its own. A read still waiting at the deadline fails with
/// `TimedOut`, which ends the connection.
#[derive(Debug)]
pub struct FirstBytes<S> {
    inner: S,
    /// Until the first bytes arrive.
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<S> FirstBytes<S> {
    /// `inner`, whose first bytes must come within `limit` from now.
    pub fn new(inner: S, limit: Duration) -> Self {
        Self {
            inner,
            deadline: Some(Box::pin(tokio::time::sleep(limit))),
        }
    }
}

/// The peer of the connection, for tonic.
impl tonic::transport::server::Connected for FirstBytes<crate::Stream> {
    type ConnectInfo = Option<Peer>;

    fn connect_info(&self) -> Option<Peer> {
        self.inner.connect_info()
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for FirstBytes<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        match &polled {
            Poll::Ready(Ok(())) if buf.filled().len() > before => self.deadline = None,
            Poll::Pending => {
                if let Some(deadline) = self.deadline.as_mut()
                    && deadline.as_mut().poll(cx).is_ready()
                {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "no request within the head timeout",
                    )));
                }
            }
            _ => {}
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for FirstBytes<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}
