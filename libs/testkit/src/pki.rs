//! A throwaway PKI for TLS tests: a CA, a server certificate for
//! `localhost` / `127.0.0.1` and a client certificate it signed, and a
//! second CA with a client certificate of its own (one a server must
//! refuse), all as PEM files in a temporary directory.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};

/// A CA and what it signed.
struct Authority {
    cert: rcgen::Certificate,
    key: KeyPair,
}

impl Authority {
    fn new(name: &str) -> Self {
        #[allow(clippy::unwrap_used)]
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        #[allow(clippy::unwrap_used)]
        let key = KeyPair::generate().unwrap();
        #[allow(clippy::unwrap_used)]
        let cert = params.self_signed(&key).unwrap();
        Self { cert, key }
    }

    /// A leaf certificate and its key, as PEM.
    fn issue(&self, name: &str, serial: u64, server: bool) -> (String, String) {
        let sans = if server {
            vec!["localhost".to_owned(), "127.0.0.1".to_owned()]
        } else {
            Vec::new()
        };
        #[allow(clippy::unwrap_used)]
        let mut params = CertificateParams::new(sans).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.serial_number = Some(serial.into());
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![if server {
            ExtendedKeyUsagePurpose::ServerAuth
        } else {
            ExtendedKeyUsagePurpose::ClientAuth
        }];
        #[allow(clippy::unwrap_used)]
        let key = KeyPair::generate().unwrap();
        #[allow(clippy::unwrap_used)]
        let cert = params.signed_by(&key, &self.cert, &self.key).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

/// A certificate file and its key file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pair {
    /// PEM certificate.
    pub cert: PathBuf,
    /// PEM private key.
    pub key: PathBuf,
}

/// The PKI and its files (removed when dropped).
pub struct TestPki {
    dir: tempfile::TempDir,
    ca: Authority,
    /// The CA certificate: servers' client CA, clients' trust anchor.
    pub ca_file: PathBuf,
    /// The server's certificate (`localhost`, `127.0.0.1`; serial 1).
    pub server: Pair,
    /// A client certificate the CA signed.
    pub client: Pair,
    /// Another CA's certificate.
    pub other_ca_file: PathBuf,
    /// A client certificate the other CA signed.
    pub other_client: Pair,
}

impl TestPki {
    /// Makes both CAs and their certificates.
    pub fn new() -> Self {
        #[allow(clippy::unwrap_used)]
        let dir = tempfile::tempdir().unwrap();
        let ca = Authority::new("runyard test CA");
        let other = Authority::new("another CA");
        let write = |name: &str, text: &str| {
            let path = dir.path().join(name);
            #[allow(clippy::unwrap_used)]
            std::fs::write(&path, text).unwrap();
            path
        };
        let ca_file = write("ca.pem", &ca.cert.pem());
        let other_ca_file = write("other-ca.pem", &other.cert.pem());
        let pair = |name: &str, (cert, key): (String, String)| Pair {
            cert: write(&format!("{name}.pem"), &cert),
            key: write(&format!("{name}.key"), &key),
        };
        let server = pair("server", ca.issue("runyard test server 1", 1, true));
        let client = pair("client", ca.issue("runyard test client", 2, false));
        let other_client = pair("other-client", other.issue("stranger", 3, false));
        Self {
            dir,
            ca,
            ca_file,
            server,
            client,
            other_ca_file,
            other_client,
        }
    }

    /// The directory holding the files.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A new server certificate from the same CA (common name
    /// `runyard test server <serial>`), as PEM (certificate, key).
    pub fn server_pem(&self, serial: u64) -> (String, String) {
        self.ca
            .issue(&format!("runyard test server {serial}"), serial, true)
    }

    /// An HTTPS client trusting the test CA alone, presenting `identity`
    /// when given.
    pub fn https_client(&self, identity: Option<&Pair>) -> reqwest::Client {
        #[allow(clippy::unwrap_used)]
        let ca = reqwest::Certificate::from_pem(&std::fs::read(&self.ca_file).unwrap()).unwrap();
        let mut builder = reqwest::Client::builder()
            .tls_built_in_root_certs(false)
            .add_root_certificate(ca)
            .timeout(std::time::Duration::from_secs(10));
        if let Some(pair) = identity {
            #[allow(clippy::unwrap_used)]
            let mut pem = std::fs::read(&pair.key).unwrap();
            #[allow(clippy::unwrap_used)]
            pem.extend(std::fs::read(&pair.cert).unwrap());
            #[allow(clippy::unwrap_used)]
            let identity = reqwest::Identity::from_pem(&pem).unwrap();
            builder = builder.identity(identity);
        }
        #[allow(clippy::unwrap_used)]
        builder.build().unwrap()
    }
}

impl std::fmt::Debug for TestPki {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestPki")
            .field("dir", &self.dir.path())
            .finish_non_exhaustive()
    }
}

impl Default for TestPki {
    fn default() -> Self {
        Self::new()
    }
}
