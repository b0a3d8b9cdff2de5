//! PEM files into what rustls takes: certificate chains, private keys and
//! root stores. Errors name the file (and the variable it came from), never
//! its content: a key's parse error could quote part of it.

use std::path::Path;
use std::sync::Arc;

use rustls::RootCertStore;

use crate::TlsError;
use rustls::pki_types::pem::{self, PemObject as _};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// A file as named to people: `RUNYARD_X_TLS_CERT (/etc/tls/tls.crt)`.
pub(crate) fn named(var: &str, path: &Path) -> String {
    format!("{var} ({})", path.display())
}

/// Reads `path`, the file `var` names.
pub(crate) fn read(var: &str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        file: named(var, path),
        source,
    })
}

/// The certificates of a PEM file, in order (a chain: leaf first).
pub(crate) fn certificates(
    var: &str,
    path: &Path,
    pem_bytes: &[u8],
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem_bytes)
        .collect::<Result<Vec<_>, pem::Error>>()
        .map_err(|e| {
            TlsError::Unusable(format!(
                "{}: not a PEM certificate file: {e}",
                named(var, path)
            ))
        })?;
    if certs.is_empty() {
        return Err(TlsError::Unusable(format!(
            "{}: no PEM certificate in it",
            named(var, path)
        )));
    }
    Ok(certs)
}

/// The private key of a PEM file (PKCS#8, PKCS#1 or SEC1). The parser's
/// own message is left out: it may quote the file.
pub(crate) fn private_key(
    var: &str,
    path: &Path,
    pem_bytes: &[u8],
) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_slice(pem_bytes).map_err(|e| match e {
        pem::Error::NoItemsFound => TlsError::Unusable(format!(
            "{}: no PEM private key in it (PKCS#8, PKCS#1 or SEC1)",
            named(var, path)
        )),
        _ => TlsError::Unusable(format!(
            "{}: not a readable PEM private key",
            named(var, path)
        )),
    })
}

/// The CA certificates of a PEM file as a root store.
pub(crate) fn roots(
    var: &str,
    path: &Path,
    pem_bytes: &[u8],
) -> Result<Arc<RootCertStore>, TlsError> {
    let mut store = RootCertStore::empty();
    for cert in certificates(var, path, pem_bytes)? {
        store.add(cert).map_err(|e| {
            TlsError::Unusable(format!(
                "{}: not a usable CA certificate: {e}",
                named(var, path)
            ))
        })?;
    }
    Ok(Arc::new(store))
}

/// The one crypto provider runyard uses, explicitly: a configuration never
/// depends on which provider happens to be installed process-wide.
pub(crate) fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}
