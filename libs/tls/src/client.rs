//! The client side of TLS to the allocator (the scaler, the CLI):
//! `RUNYARD_ALLOCATOR_CA_FILE` to trust a private CA instead of the public
//! roots, `RUNYARD_ALLOCATOR_CLIENT_CERT` and `_CLIENT_KEY` to present a
//! certificate where the allocator wants one (mTLS).

use std::path::{Path, PathBuf};

use crate::TlsError;
use crate::material;

/// The CA bundle the allocator's certificate is checked against.
pub const CA_FILE_VAR: &str = "RUNYARD_ALLOCATOR_CA_FILE";
/// The client certificate (PEM chain) presented to the allocator.
pub const CLIENT_CERT_VAR: &str = "RUNYARD_ALLOCATOR_CLIENT_CERT";
/// The client certificate's private key.
pub const CLIENT_KEY_VAR: &str = "RUNYARD_ALLOCATOR_CLIENT_KEY";

/// A client's TLS files, checked ([`ClientFiles::new`]) and read again
/// when a client is made.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientFiles {
    /// The CA bundle; none → the public (webpki) roots.
    pub ca: Option<PathBuf>,
    /// The client certificate and its key, for mTLS.
    pub identity: Option<(PathBuf, PathBuf)>,
}

impl ClientFiles {
    /// The files given (empty paths count as unset); a certificate without
    /// its key or the reverse is refused naming both variables, a file
    /// that cannot be read or holds no certificate (key) naming it.
    pub fn new(
        ca: Option<&Path>,
        cert: Option<&Path>,
        key: Option<&Path>,
    ) -> Result<Self, TlsError> {
        let set = |p: Option<&Path>| p.filter(|p| !p.as_os_str().is_empty()).map(Path::to_owned);
        let identity = match (set(cert), set(key)) {
            (Some(c), Some(k)) => Some((c, k)),
            (None, None) => None,
            _ => {
                return Err(TlsError::Settings(format!(
                    "{CLIENT_CERT_VAR} and {CLIENT_KEY_VAR} go together: set both (mTLS) or neither"
                )));
            }
        };
        let files = Self {
            ca: set(ca),
            identity,
        };
        files.read()?;
        Ok(files)
    }

    /// Nothing set: the defaults (public roots, no client certificate).
    pub fn is_empty(&self) -> bool {
        self.ca.is_none() && self.identity.is_none()
    }

    /// The PEM bytes: the CA bundle, the certificate and the key, each
    /// checked.
    #[allow(clippy::type_complexity)]
    fn read(&self) -> Result<(Option<Vec<u8>>, Option<(Vec<u8>, Vec<u8>)>), TlsError> {
        let ca = match &self.ca {
            Some(path) => {
                let bytes = material::read(CA_FILE_VAR, path)?;
                material::roots(CA_FILE_VAR, path, &bytes)?;
                Some(bytes)
            }
            None => None,
        };
        let identity = match &self.identity {
            Some((cert, key)) => {
                let cert_pem = material::read(CLIENT_CERT_VAR, cert)?;
                material::certificates(CLIENT_CERT_VAR, cert, &cert_pem)?;
                let key_pem = material::read(CLIENT_KEY_VAR, key)?;
                material::private_key(CLIENT_KEY_VAR, key, &key_pem)?;
                Some((cert_pem, key_pem))
            }
            None => None,
        };
        Ok((ca, identity))
    }

    /// tonic's TLS settings for an `https://` allocator URL.
    pub fn grpc(&self) -> Result<tonic::transport::ClientTlsConfig, TlsError> {
        use tonic::transport::{Certificate, ClientTlsConfig, Identity};
        let (ca, identity) = self.read()?;
        let tls = match ca {
            Some(ca) => ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca)),
            None => ClientTlsConfig::new().with_webpki_roots(),
        };
        Ok(match identity {
            Some((cert, key)) => tls.identity(Identity::from_pem(cert, key)),
            None => tls,
        })
    }

    /// An HTTP client builder trusting the CA (alone) and presenting the
    /// client certificate, for `https://` URLs.
    pub fn http(
        &self,
        builder: reqwest::ClientBuilder,
    ) -> Result<reqwest::ClientBuilder, TlsError> {
        let (ca, identity) = self.read()?;
        let mut builder = builder;
        if let (Some(ca), Some(path)) = (ca, &self.ca) {
            let certs = reqwest::Certificate::from_pem_bundle(&ca).map_err(|e| {
                TlsError::Unusable(format!("{}: {e}", material::named(CA_FILE_VAR, path)))
            })?;
            builder = builder.tls_built_in_root_certs(false);
            for cert in certs {
                builder = builder.add_root_certificate(cert);
            }
        }
        if let (Some((cert, key)), Some((cert_path, key_path))) = (identity, &self.identity) {
            let mut pem = key;
            pem.push(b'\n');
            pem.extend_from_slice(&cert);
            // reqwest's message would be about the key: leave it out.
            let identity = reqwest::Identity::from_pem(&pem).map_err(|_| {
                TlsError::Unusable(format!(
                    "{} with {}: not a usable client certificate and key",
                    material::named(CLIENT_CERT_VAR, cert_path),
                    material::named(CLIENT_KEY_VAR, key_path)
                ))
            })?;
            builder = builder.identity(identity);
        }
        Ok(builder)
    }
}
