//! A service's server-side TLS: its files, the rustls configurations its
//! listeners hand out, and their reload when the files change.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;

use rustls::RootCertStore;
use rustls::ServerConfig;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;

use crate::TlsError;
use crate::material::{self, named};

/// How often the files are checked for changes (the services' setting;
/// tests pass their own to [`ServerTls::watch`]).
pub const RELOAD_EVERY: Duration = Duration::from_secs(10);

/// `RUNYARD_<SERVICE>_TLS_CERT`, `_TLS_KEY` and `_TLS_CLIENT_CA` of one
/// service: a PEM certificate chain (leaf first), its private key and,
/// for mTLS, the CA(s) client certificates must be signed by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerFiles {
    /// `RUNYARD_<SERVICE>`, to name the variables in messages.
    prefix: String,
    /// The certificate chain.
    pub cert: PathBuf,
    /// The private key.
    pub key: PathBuf,
    /// The client CA bundle; set → mTLS (see [`ClientAuth`]).
    pub client_ca: Option<PathBuf>,
}

impl ServerFiles {
    /// The files a service was given (`service` as in the variables'
    /// names: `INGEST`, `ALLOCATOR`, `TRACKER`, `SCALER`); `None` when
    /// neither certificate nor key is set (plaintext). An empty path counts
    /// as unset (compose's `${VAR:-}`). A certificate without a key (or the
    /// reverse), or a client CA without both, is refused naming the
    /// variables: a listener meant to be private must not come up open.
    pub fn from_settings(
        service: &str,
        cert: Option<&Path>,
        key: Option<&Path>,
        client_ca: Option<&Path>,
    ) -> Result<Option<Self>, TlsError> {
        let set = |p: Option<&Path>| p.filter(|p| !p.as_os_str().is_empty()).map(Path::to_owned);
        let prefix = format!("RUNYARD_{service}");
        match (set(cert), set(key), set(client_ca)) {
            (Some(cert), Some(key), client_ca) => Ok(Some(Self {
                prefix,
                cert,
                key,
                client_ca,
            })),
            (None, None, None) => Ok(None),
            (None, None, Some(_)) => Err(TlsError::Settings(format!(
                "{prefix}_TLS_CLIENT_CA is set without {prefix}_TLS_CERT and {prefix}_TLS_KEY: mTLS needs the listener's own certificate and key too"
            ))),
            _ => Err(TlsError::Settings(format!(
                "{prefix}_TLS_CERT and {prefix}_TLS_KEY go together: set both (TLS) or neither (plaintext)"
            ))),
        }
    }

    /// Whether a client CA is set (mTLS where the listener asks for it).
    pub fn mtls(&self) -> bool {
        self.client_ca.is_some()
    }

    fn var(&self, suffix: &str) -> String {
        format!("{}_{suffix}", self.prefix)
    }

    /// The files' bytes as they are now.
    fn read(&self) -> Result<Snapshot, TlsError> {
        Ok(Snapshot {
            cert: material::read(&self.var("TLS_CERT"), &self.cert)?,
            key: material::read(&self.var("TLS_KEY"), &self.key)?,
            client_ca: self
                .client_ca
                .as_deref()
                .map(|p| material::read(&self.var("TLS_CLIENT_CA"), p))
                .transpose()?,
        })
    }

    /// What the bytes hold, checked.
    fn parse(&self, s: &Snapshot) -> Result<Material, TlsError> {
        let chain = material::certificates(&self.var("TLS_CERT"), &self.cert, &s.cert)?;
        let key = material::private_key(&self.var("TLS_KEY"), &self.key, &s.key)?;
        let roots = match (&self.client_ca, &s.client_ca) {
            (Some(path), Some(bytes)) => {
                Some(material::roots(&self.var("TLS_CLIENT_CA"), path, bytes)?)
            }
            _ => None,
        };
        Ok(Material { chain, key, roots })
    }
}

/// Whether a listener asks clients for a certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientAuth {
    /// With a client CA, a client without a certificate it signed is
    /// refused at the handshake (mTLS); without one, none is asked for.
    Required,
    /// With a client CA, a certificate is asked for and verified when
    /// given, but a client without one gets through: the service decides
    /// per request ([`crate::Peer::client_certificate`]).
    Optional,
    /// Never asked for, client CA or not (listeners whose clients
    /// authenticate otherwise, like runner instances with their token).
    Never,
}

/// The application protocols a listener offers in ALPN.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocols {
    /// HTTP/2 and HTTP/1.1 (axum routers).
    Http,
    /// HTTP/2 only (gRPC).
    Grpc,
}

impl Protocols {
    fn alpn(self) -> Vec<Vec<u8>> {
        match self {
            Self::Http => vec![b"h2".to_vec(), b"http/1.1".to_vec()],
            Self::Grpc => vec![b"h2".to_vec()],
        }
    }
}

/// One listener's handshake settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Policy {
    client_auth: ClientAuth,
    protocols: Protocols,
}

/// The files' bytes, to tell whether they changed.
#[derive(PartialEq, Eq)]
struct Snapshot {
    cert: Vec<u8>,
    key: Vec<u8>,
    client_ca: Option<Vec<u8>>,
}

/// The loaded files.
struct Material {
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    roots: Option<Arc<RootCertStore>>,
}

impl Material {
    /// The rustls configuration of a listener with `policy`.
    fn config(&self, files: &ServerFiles, policy: Policy) -> Result<ServerConfig, TlsError> {
        let provider = material::provider();
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .map_err(|e| TlsError::Settings(format!("TLS versions: {e}")))?;
        let verifier = match (&self.roots, policy.client_auth) {
            (Some(roots), ClientAuth::Required | ClientAuth::Optional) => {
                let b = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider);
                let b = if policy.client_auth == ClientAuth::Optional {
                    b.allow_unauthenticated()
                } else {
                    b
                };
                Some(b.build().map_err(|e| {
                    let ca = files.client_ca.as_deref().unwrap_or(Path::new(""));
                    TlsError::Unusable(format!("{}: {e}", named(&files.var("TLS_CLIENT_CA"), ca)))
                })?)
            }
            _ => None,
        };
        let builder = match verifier {
            Some(v) => builder.with_client_cert_verifier(v),
            None => builder.with_no_client_auth(),
        };
        let mut config = builder
            .with_single_cert(self.chain.clone(), self.key.clone_key())
            .map_err(|e| {
                let (cert, key) = (
                    named(&files.var("TLS_CERT"), &files.cert),
                    named(&files.var("TLS_KEY"), &files.key),
                );
                match e {
                    rustls::Error::InconsistentKeys(_) => TlsError::Unusable(format!(
                        "{key} is not the key of the certificate in {cert}"
                    )),
                    other => TlsError::Unusable(format!("{cert} with {key}: {other}")),
                }
            })?;
        config.alpn_protocols = policy.protocols.alpn();
        Ok(config)
    }
}

/// A listener's current configuration, swapped whole on a reload.
type Slot = RwLock<Arc<ServerConfig>>;

struct State {
    material: Material,
    /// What the files held when last read, loaded or not.
    seen: Snapshot,
    /// Every acceptor's policy and configuration, updated together.
    slots: Vec<(Policy, Weak<Slot>)>,
}

struct Shared {
    files: ServerFiles,
    state: Mutex<State>,
}

/// What [`ServerTls::reload`] did.
#[derive(Debug)]
pub enum Reload {
    /// The files are as they were.
    Unchanged,
    /// New files, loaded: new connections get them.
    Reloaded,
}

/// A service's loaded TLS files, shared by its listeners. Cheap to clone.
#[derive(Clone)]
pub struct ServerTls {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The files' names, never their content.
        f.debug_struct("ServerTls")
            .field("files", &self.shared.files)
            .finish_non_exhaustive()
    }
}

impl ServerTls {
    /// Reads and checks `files` (a certificate chain and its key, a client
    /// CA); errors name the variable and the file.
    pub fn load(files: ServerFiles) -> Result<Self, TlsError> {
        let seen = files.read()?;
        let material = files.parse(&seen)?;
        // The pair is checked now, not at the first handshake.
        let check = Policy {
            client_auth: ClientAuth::Required,
            protocols: Protocols::Http,
        };
        material.config(&files, check)?;
        Ok(Self {
            shared: Arc::new(Shared {
                files,
                state: Mutex::new(State {
                    material,
                    seen,
                    slots: Vec::new(),
                }),
            }),
        })
    }

    /// [`ServerTls::load`], then [`ServerTls::watch`] every
    /// [`RELOAD_EVERY`]: what a service does with its files.
    pub fn start(files: ServerFiles) -> Result<Self, TlsError> {
        let tls = Self::load(files)?;
        tls.watch(RELOAD_EVERY);
        let files = &tls.shared.files;
        tracing::info!(
            cert = %files.cert.display(),
            client_ca = files.client_ca.as_ref().map(|p| p.display().to_string()),
            "TLS on; the files are checked for changes every {}s",
            RELOAD_EVERY.as_secs()
        );
        Ok(tls)
    }

    /// [`ServerTls::start`] on `RUNYARD_<service>_TLS_*`'s files, when
    /// they are set ([`ServerFiles::from_settings`]).
    pub fn from_settings(
        service: &str,
        cert: Option<&std::path::Path>,
        key: Option<&std::path::Path>,
        client_ca: Option<&std::path::Path>,
    ) -> Result<Option<Self>, TlsError> {
        ServerFiles::from_settings(service, cert, key, client_ca)?
            .map(Self::start)
            .transpose()
    }

    /// The acceptor of a service's one HTTP listener: TLS when its files are
    /// set, a client certificate required when it has a client CA.
    pub fn http_acceptor(
        service: &str,
        cert: Option<&std::path::Path>,
        key: Option<&std::path::Path>,
        client_ca: Option<&std::path::Path>,
    ) -> Result<Option<Acceptor>, TlsError> {
        Self::from_settings(service, cert, key, client_ca)?
            .map(|t| t.acceptor(ClientAuth::Required, Protocols::Http))
            .transpose()
    }

    /// The files.
    pub fn files(&self) -> &ServerFiles {
        &self.shared.files
    }

    /// A listener's handshake settings, kept current across reloads.
    pub fn acceptor(
        &self,
        client_auth: ClientAuth,
        protocols: Protocols,
    ) -> Result<Acceptor, TlsError> {
        let policy = Policy {
            client_auth,
            protocols,
        };
        let mut state = self.lock();
        let config = state.material.config(&self.shared.files, policy)?;
        let slot = Arc::new(RwLock::new(Arc::new(config)));
        state.slots.push((policy, Arc::downgrade(&slot)));
        Ok(Acceptor {
            shared: self.shared.clone(),
            slot,
        })
    }

    /// Reads the files again; when they changed and can be used, every
    /// acceptor hands out the new configuration from its next handshake
    /// on (connections already open keep theirs). When they changed but
    /// cannot be used (half-written, a key that does not match), the old
    /// configuration stays and the error says which file; the same files
    /// are not tried again until they change again.
    pub fn reload(&self) -> Result<Reload, TlsError> {
        let files = &self.shared.files;
        let now = files.read()?;
        let mut state = self.lock();
        if now == state.seen {
            return Ok(Reload::Unchanged);
        }
        let material = files.parse(&now);
        state.seen = now;
        let material = material?;
        state.slots.retain(|(_, slot)| slot.strong_count() > 0);
        let mut fresh = Vec::with_capacity(state.slots.len());
        for (policy, slot) in &state.slots {
            if let Some(slot) = slot.upgrade() {
                fresh.push((slot, Arc::new(material.config(files, *policy)?)));
            }
        }
        for (slot, config) in fresh {
            *slot.write().unwrap_or_else(|e| e.into_inner()) = config;
        }
        state.material = material;
        Ok(Reload::Reloaded)
    }

    /// Checks the files every `every` and reloads them when they change
    /// (see [`ServerTls::reload`]), logging what happened; a failure is
    /// logged once, not at every check. Stops once this and every
    /// acceptor are dropped.
    pub fn watch(&self, every: Duration) {
        let weak = Arc::downgrade(&self.shared);
        tokio::spawn(async move {
            let mut last_failure: Option<String> = None;
            loop {
                tokio::time::sleep(every).await;
                let Some(shared) = weak.upgrade() else { return };
                let tls = Self { shared };
                match tls.reload() {
                    Ok(Reload::Unchanged) => {}
                    Ok(Reload::Reloaded) => {
                        last_failure = None;
                        tracing::info!(
                            cert = %tls.shared.files.cert.display(),
                            "TLS files changed: new connections get the new certificate"
                        );
                    }
                    Err(error) => {
                        let error = format!("{error:#}");
                        if last_failure.as_ref() != Some(&error) {
                            tracing::warn!(
                                %error,
                                "TLS files changed but cannot be used; the previous certificate stays"
                            );
                            last_failure = Some(error);
                        }
                    }
                }
            }
        });
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.shared.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// One listener's handshake settings (see [`ServerTls::acceptor`]).
#[derive(Clone)]
pub struct Acceptor {
    /// Keeps the files watched while a listener uses them.
    shared: Arc<Shared>,
    slot: Arc<Slot>,
}

impl std::fmt::Debug for Acceptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Acceptor")
            .field("files", &self.shared.files)
            .finish_non_exhaustive()
    }
}

impl Acceptor {
    /// The configuration the next handshake uses.
    pub fn current(&self) -> Arc<ServerConfig> {
        self.slot.read().unwrap_or_else(|e| e.into_inner()).clone()
    }
}
