//! Why TLS settings or files cannot be used.

/// Why TLS settings or files cannot be used. Every message names the
/// variables and files concerned, never a file's content (a key's parse
/// error could quote part of it).
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// Settings that cannot work together: a certificate without its key,
    /// a client CA without the listener's own pair, TLS versions rustls
    /// refuses.
    #[error("{0}")]
    Settings(String),
    /// A file that cannot be read.
    #[error("{file}: cannot read it: {source}")]
    Read {
        /// The variable and the path, as people name them.
        file: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A file, or a certificate and key together, whose content cannot be
    /// used.
    #[error("{0}")]
    Unusable(String),
}
