//! TLS for runyard: every service's listeners and the clients of the
//! allocator, configured the same way everywhere.
//!
//! - [`ServerFiles`]: a service's `RUNYARD_<SERVICE>_TLS_CERT`, `_TLS_KEY`
//!   and `_TLS_CLIENT_CA`, checked before anything starts (one of the pair
//!   without the other, or a file that cannot be used, refuses to start
//!   naming the variable and the file);
//! - [`ServerTls`]: the loaded files, read again whenever they change (a
//!   bad new file keeps the old configuration, with a warning naming the
//!   file); [`ServerTls::acceptor`] gives one listener's handshake settings
//!   ([`ClientAuth`]: whether a client certificate is required, optional or
//!   never asked for; [`Protocols`]: ALPN);
//! - [`Listener`]: a bound TCP listener, plaintext or TLS, that serves an
//!   axum router ([`serve`], which bounds how long a request head may take)
//!   or a tonic server ([`Listener::incoming`]);
//!   [`Peer`] says who connected and whether with a verified client
//!   certificate;
//! - [`ClientFiles`]: `RUNYARD_ALLOCATOR_CA_FILE`, `_CLIENT_CERT` and
//!   `_CLIENT_KEY`, the scaler's and the CLI's side of TLS and mTLS to the
//!   allocator (gRPC and HTTP).
//!
//! Only rustls with the `ring` provider is used, as everywhere in runyard.
//! No key material ever reaches a log or an error: errors name variables
//! and files, never their content.

mod client;
mod error;
mod listener;
mod material;
mod serve;
mod server;

pub use client::{CA_FILE_VAR, CLIENT_CERT_VAR, CLIENT_KEY_VAR, ClientFiles};
pub use error::TlsError;
pub use listener::{Listener, Peer, Stream, peer_key};
pub use serve::{FirstBytes, HEAD_TIMEOUT, serve};
pub use server::{Acceptor, ClientAuth, Protocols, RELOAD_EVERY, Reload, ServerFiles, ServerTls};
