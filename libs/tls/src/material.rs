//! PEM files into what rustls takes: certificate chains, private keys and
//! root stores. Errors name the file (and the variable it came from), never
//! its content: a key's parse error could quote part of it.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context as _;
use rustls::RootCertStore;
use rustls::pki_types::pem::{self, PemObject as _};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// A file as named to people: `RUNYARD_X_TLS_CERT (/etc/tls/tls.crt)`.
pub(crate) fn named(var: &str, path: &Path) -> String {
    format!("{var} ({})", path.display())
}

/// Reads `path`, the file `var` names.
pub(crate) fn read(var: &str, path: &Path) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("{}: cannot read it", named(var, path)))
}

/// The certificates of a PEM file, in order (a chain: leaf first).
pub(crate) fn certificates(
    var: &str,
    path: &Path,
    pem_bytes: &[u8],
) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_slice_iter(pem_bytes)
        .collect::<Result<Vec<_>, pem::Error>>()
        .map_err(|e| anyhow::anyhow!("{}: not a PEM certificate file: {e}", named(var, path)))?;
    anyhow::ensure!(
        !certs.is_empty(),
        "{}: no PEM certificate in it",
        named(var, path)
    );
    Ok(certs)
}

/// The private key of a PEM file (PKCS#8, PKCS#1 or SEC1). The parser's
/// own message is left out: it may quote the file.
pub(crate) fn private_key(
    var: &str,
    path: &Path,
    pem_bytes: &[u8],
) -> anyhow::Result<PrivateKeyDer<'static>> {
    PrivateKeyDer::from_pem_slice(pem_bytes).map_err(|e| match e {
        pem::Error::NoItemsFound => anyhow::anyhow!(
            "{}: no PEM private key in it (PKCS#8, PKCS#1 or SEC1)",
            named(var, path)
        ),
        _ => anyhow::anyhow!("{}: not a readable PEM private key", named(var, path)),
    })
}

/// The CA certificates of a PEM file as a root store.
pub(crate) fn roots(
    var: &str,
    path: &Path,
    pem_bytes: &[u8],
) -> anyhow::Result<Arc<RootCertStore>> {
    let mut store = RootCertStore::empty();
    for cert in certificates(var, path, pem_bytes)? {
        store.add(cert).map_err(|e| {
            anyhow::anyhow!("{}: not a usable CA certificate: {e}", named(var, path))
        })?;
    }
    Ok(Arc::new(store))
}

/// The one crypto provider runyard uses, explicitly: a configuration never
/// depends on which provider happens to be installed process-wide.
pub(crate) fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}
