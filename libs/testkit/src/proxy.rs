//! A TCP proxy a test can cut and restore, to make a real server (Postgres)
//! unreachable for a while without disturbing other tests that share it.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

/// A cuttable proxy to `upstream`.
#[derive(Debug)]
pub struct TcpProxy {
    addr: SocketAddr,
    upstream: SocketAddr,
    current: Arc<Mutex<CancellationToken>>,
}

impl TcpProxy {
    /// Starts proxying a free loopback port to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Self {
        #[allow(clippy::unwrap_used)]
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        #[allow(clippy::unwrap_used)]
        let addr = listener.local_addr().unwrap();
        let token = CancellationToken::new();
        tokio::spawn(serve(listener, upstream, token.clone()));
        Self {
            addr,
            upstream,
            current: Arc::new(Mutex::new(token)),
        }
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Drops every open connection and refuses new ones.
    pub async fn cut(&self) {
        self.current.lock().await.cancel();
    }

    /// Accepts connections again on the same port.
    pub async fn restore(&self) {
        let token = CancellationToken::new();
        let listener = loop {
            match TcpListener::bind(self.addr).await {
                Ok(l) => break l,
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(20)).await,
            }
        };
        tokio::spawn(serve(listener, self.upstream, token.clone()));
        *self.current.lock().await = token;
    }
}

async fn serve(listener: TcpListener, upstream: SocketAddr, token: CancellationToken) {
    loop {
        let accepted = tokio::select! {
            () = token.cancelled() => return,
            a = listener.accept() => a,
        };
        let Ok((mut client, _)) = accepted else {
            continue;
        };
        let token = token.clone();
        tokio::spawn(async move {
            let Ok(mut server) = TcpStream::connect(upstream).await else {
                return;
            };
            tokio::select! {
                () = token.cancelled() => {}
                _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
            }
        });
    }
}
