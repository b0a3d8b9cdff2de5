//! A TCP listener that hands out plaintext or TLS connections, for axum
//! ([`axum::serve`] takes it as it is) and tonic ([`Listener::incoming`]).
//!
//! Handshakes run concurrently, each bounded in time, so a client that
//! connects and says nothing holds up no one; a failed handshake (no
//! client certificate under mTLS, plaintext sent to a TLS port, a
//! certificate from another CA) closes that connection and is logged at
//! debug only (anyone can cause it).

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

use crate::server::Acceptor;

/// How long a client may take to complete its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshakes under way at once; more connections wait in the backlog.
const MAX_HANDSHAKES: usize = 1024;

/// Who is on the other end of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer {
    /// The client's address.
    pub addr: SocketAddr,
    /// Whether the client presented a certificate the listener's client
    /// CA verified (always false on plaintext and without a client CA).
    pub client_certificate: bool,
}

/// The client a per-client bound counts for `ip`: an IPv4 address (an
/// IPv4-mapped IPv6 one as that IPv4 address), or the /64 of an IPv6 one,
/// since a host holds a whole /64.
pub fn peer_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6((u128::from(v6) & !((1u128 << 64) - 1)).into()),
        },
    }
}

/// A bound listener, serving TLS when given an [`Acceptor`].
#[derive(Debug)]
pub struct Listener {
    tcp: TcpListener,
    tls: Option<Acceptor>,
    nodelay: bool,
    handshakes: JoinSet<Option<(Stream, Peer)>>,
}

impl Listener {
    /// `tcp`, plaintext without `tls`.
    pub fn new(tcp: TcpListener, tls: Option<Acceptor>) -> Self {
        Self {
            tcp,
            tls,
            nodelay: false,
            handshakes: JoinSet::new(),
        }
    }

    /// Sets `TCP_NODELAY` on every accepted connection (small gRPC
    /// answers go out at once).
    #[must_use]
    pub fn nodelay(mut self, on: bool) -> Self {
        self.nodelay = on;
        self
    }

    /// The bound address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.tcp.local_addr()
    }

    /// Whether connections are TLS.
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// The next connection: accepted and, with TLS, its handshake done.
    /// Accept errors are retried (after a second when the process is out
    /// of file descriptors), as axum's own listener does.
    pub async fn next(&mut self) -> (Stream, Peer) {
        loop {
            let room = self.handshakes.len() < MAX_HANDSHAKES;
            tokio::select! {
                accepted = self.tcp.accept(), if room => match accepted {
                    Ok((tcp, addr)) => {
                        if self.nodelay {
                            let _ = tcp.set_nodelay(true);
                        }
                        let Some(tls) = &self.tls else {
                            let peer = Peer { addr, client_certificate: false };
                            return (Stream::Plain(tcp), peer);
                        };
                        self.handshakes.spawn(handshake(tls.clone(), tcp, addr));
                    }
                    Err(e) => accept_error(e).await,
                },
                Some(done) = self.handshakes.join_next(), if !self.handshakes.is_empty() => {
                    if let Ok(Some(connection)) = done {
                        return connection;
                    }
                }
            }
        }
    }

    /// The connections as a stream, for tonic's
    /// `Server::serve_with_incoming*`; each must send its first bytes (the
    /// HTTP/2 preface) within [`crate::HEAD_TIMEOUT`], so silent
    /// connections cannot pile up.
    pub fn incoming(
        self,
    ) -> impl futures::Stream<Item = io::Result<crate::FirstBytes<Stream>>> + Send + 'static {
        futures::stream::unfold(self, |mut l| async move {
            let (stream, _) = l.next().await;
            Some((Ok(crate::FirstBytes::new(stream, crate::HEAD_TIMEOUT)), l))
        })
    }
}

async fn handshake(tls: Acceptor, tcp: TcpStream, addr: SocketAddr) -> Option<(Stream, Peer)> {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls.current());
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
        Ok(Ok(stream)) => {
            let client_certificate = stream
                .get_ref()
                .1
                .peer_certificates()
                .is_some_and(|c| !c.is_empty());
            let peer = Peer {
                addr,
                client_certificate,
            };
            Some((Stream::Tls(Box::new(stream), peer), peer))
        }
        Ok(Err(error)) => {
            tracing::debug!(%addr, %error, "TLS handshake failed");
            None
        }
        Err(_) => {
            tracing::debug!(%addr, "TLS handshake timed out");
            None
        }
    }
}

async fn accept_error(e: io::Error) {
    if matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    ) {
        return;
    }
    tracing::error!(error = %e, "accept error");
    tokio::time::sleep(Duration::from_secs(1)).await;
}

impl axum::serve::Listener for Listener {
    type Io = Stream;
    type Addr = Peer;

    async fn accept(&mut self) -> (Stream, Peer) {
        self.next().await
    }

    fn local_addr(&self) -> io::Result<Peer> {
        Ok(Peer {
            addr: self.tcp.local_addr()?,
            client_certificate: false,
        })
    }
}

/// `ConnectInfo<Peer>` in an axum router served with
/// `into_make_service_with_connect_info::<Peer>()`.
impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, Listener>> for Peer {
    fn connect_info(stream: axum::serve::IncomingStream<'_, Listener>) -> Self {
        *stream.remote_addr()
    }
}

/// One accepted connection.
#[derive(Debug)]
pub enum Stream {
    /// Plaintext.
    Plain(TcpStream),
    /// TLS, handshake done.
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>, Peer),
}

/// `Peer` as a request extension of tonic's.
impl tonic::transport::server::Connected for Stream {
    type ConnectInfo = Option<Peer>;

    fn connect_info(&self) -> Option<Peer> {
        match self {
            Self::Plain(tcp) => tcp.peer_addr().ok().map(|addr| Peer {
                addr,
                client_certificate: false,
            }),
            Self::Tls(_, peer) => Some(*peer),
        }
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Self::Tls(s, _) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Self::Tls(s, _) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Self::Tls(s, _) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Self::Plain(s) => s.is_write_vectored(),
            Self::Tls(s, _) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_flush(cx),
            Self::Tls(s, _) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Self::Tls(s, _) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv6_peers_count_by_their_64() {
        let ip = |s: &str| s.parse::<IpAddr>().expect("an address");
        let (a, b, c) = (
            ip("2001:db8:1:2::1"),
            ip("2001:db8:1:2:ffff::9"),
            ip("2001:db8:1:3::1"),
        );
        assert_eq!(peer_key(a), peer_key(b));
        assert_ne!(peer_key(a), peer_key(c));
        assert_eq!(peer_key(ip("::ffff:192.0.2.1")), ip("192.0.2.1"));
    }
}
