//! The event log's plumbing: connecting to NATS, creating and reconciling the
//! JetStream streams, and publishing with a dedup id, W3C trace context and
//! the event type header, awaiting JetStream's ack.

use std::time::Duration;

use async_nats::header::NATS_MESSAGE_ID;
use async_nats::jetstream::{self, message::PublishMessage, stream};
use bytes::Bytes;
use prost::Message as _;
use runyard_events::{Event, Namespace, event_type};
use secrecy::{ExposeSecret as _, SecretString};

pub mod consumer;
pub mod raw;
mod trace;
pub use async_nats::header::{HeaderMap, HeaderName, HeaderValue};
pub use raw::raw_message;
pub use runyard_telemetry::traces::Status as SpanStatus;
pub use trace::{TraceParent, adopt, current as current_trace, follow};

/// Header carrying the event type (`JobObserved`, ...).
pub const EVENT_TYPE_HEADER: &str = "Runyard-Event-Type";
/// W3C trace context header.
pub const TRACEPARENT_HEADER: &str = "traceparent";

/// [`EVENT_TYPE_HEADER`] as a header name (static: no allocation per use).
pub const EVENT_TYPE: HeaderName = HeaderName::from_static(EVENT_TYPE_HEADER);
/// [`TRACEPARENT_HEADER`] as a header name (static: no allocation per use).
pub const TRACEPARENT: HeaderName = HeaderName::from_static(TRACEPARENT_HEADER);

/// Errors talking to NATS.
#[derive(Debug, thiserror::Error)]
pub enum BusError {
    /// The client is not connected; nothing was sent.
    #[error("not connected to nats")]
    Disconnected,
    /// The server did not acknowledge in time; the message may or may not be
    /// stored (a retry with the same id is safe).
    #[error("no acknowledgement from jetstream within {0:?}")]
    AckTimeout(Duration),
    /// The message is larger than the server accepts.
    #[error("message of {0} bytes exceeds the server's max_payload")]
    TooLarge(usize),
    /// The stream is at its size bound (`max_bytes` with discard `new`): the
    /// message was refused and nothing stored was dropped; retry later.
    #[error("publishing: the stream is full (maximum bytes exceeded)")]
    StreamFull,
    /// Any other failure of a publish or stream operation.
    #[error("{context}: {source}")]
    Nats {
        /// What was being done.
        context: &'static str,
        /// The client's error.
        #[source]
        source: async_nats::Error,
    },
    /// A connection setting cannot be used (names the variable).
    #[error("{0}")]
    Settings(String),
    /// Could not connect at all.
    #[error("connecting to {url}: {source}")]
    Connect {
        /// Where, with credentials redacted.
        url: String,
        /// Why.
        #[source]
        source: async_nats::ConnectError,
    },
}

/// How long and how much streams keep, and the dedup window.
///
/// Both streams are bounded in bytes too. The event log refuses new
/// messages when full (`DiscardPolicy::New`: ingest answers 503 and the
/// forge retries; nothing accepted is ever dropped to make room), raw
/// deliveries give way oldest first (`DiscardPolicy::Old`: they are a
/// debugging copy). JetStream reserves each stream's `max_bytes` against
/// the server's `max_file_store`, so that must hold the sum for every
/// namespace it serves.
#[derive(Debug, Clone)]
pub struct StreamSettings {
    /// `<NS>_EVENTS` retention by age (default 90 days).
    pub events_max_age: Duration,
    /// `<NS>_RAW` retention by age (default 7 days).
    pub raw_max_age: Duration,
    /// `<NS>_EVENTS` size bound in bytes (default 8 GiB; 0 = none).
    pub events_max_bytes: u64,
    /// `<NS>_RAW` size bound in bytes (default 4 GiB; 0 = none).
    pub raw_max_bytes: u64,
    /// Duplicate window of both streams (default 24 h, capped at each
    /// stream's max age).
    pub duplicate_window: Duration,
    /// Replicas (1 on a single server, 3 on a cluster).
    pub replicas: usize,
}

impl Default for StreamSettings {
    fn default() -> Self {
        Self {
            events_max_age: Duration::from_secs(90 * 24 * 3600),
            raw_max_age: Duration::from_secs(7 * 24 * 3600),
            events_max_bytes: 8 << 30,
            raw_max_bytes: 4 << 30,
            duplicate_window: Duration::from_secs(24 * 3600),
            replicas: 1,
        }
    }
}

/// What JetStream said about a stored message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    /// Stream sequence.
    pub sequence: u64,
    /// True when the id was already in the dedup window.
    pub duplicate: bool,
}

/// One message to publish, in the simple form: headers as strings.
///
/// Publishing converts it into a [`Prepared`]; code that publishes on every
/// request builds the [`Prepared`] directly instead.
#[derive(Debug, Clone)]
pub struct Outgoing {
    /// Subject.
    pub subject: String,
    /// `Nats-Msg-Id`: the dedup id.
    pub id: String,
    /// Extra headers (the raw delivery's headers, the event type, ...).
    pub headers: Vec<(String, String)>,
    /// Body.
    pub payload: Bytes,
}

/// One message to publish with its NATS headers already built, the dedup id
/// (`Nats-Msg-Id`) among them: what [`Bus::publish_prepared`] sends as is.
///
/// Ingest publishes a few of these for every delivery; building the
/// [`HeaderMap`] once, with static names for the fixed headers, costs a
/// fraction of going through [`Outgoing`]'s strings.
#[derive(Debug, Clone)]
pub struct Prepared {
    /// Subject.
    pub subject: String,
    /// Every header, `Nats-Msg-Id` included.
    pub headers: HeaderMap,
    /// Body.
    pub payload: Bytes,
}

impl Prepared {
    /// A message on `subject` whose only header is `Nats-Msg-Id` = `id`.
    ///
    /// # Panics
    ///
    /// When `id` contains a CR or LF (event ids never do).
    pub fn new(subject: String, id: &str, payload: Bytes) -> Self {
        let mut headers = HeaderMap::new();
        headers.insert(NATS_MESSAGE_ID, id);
        Self {
            subject,
            headers,
            payload,
        }
    }
}

impl From<Outgoing> for Prepared {
    fn from(msg: Outgoing) -> Self {
        let mut headers = HeaderMap::new();
        for (k, v) in &msg.headers {
            headers.insert(k.as_str(), v.as_str());
        }
        // Last, so that it wins over a header of the same name.
        headers.insert(NATS_MESSAGE_ID, msg.id.as_str());
        Self {
            subject: msg.subject,
            headers,
            payload: msg.payload,
        }
    }
}

/// How to reach a NATS that wants more than a URL: a user and password
/// given apart from the URL, a `.creds` file (JWT and NKey seed), a bare
/// NKey seed, and the CA of a server with TLS. User and password, or a
/// token, may also ride in the URL itself (`nats://user:pw@host`,
/// `nats://token@host`); `tls://` asks for TLS with the system's roots.
///
/// Whichever way they come, credentials go to the client as connect
/// options and never as part of a server address: the client logs its
/// addresses (at debug, on every connection attempt).
#[derive(Debug, Clone, Default)]
pub struct NatsAccess {
    /// `RUNYARD_NATS_USER`: the user to log in as, with
    /// [`NatsAccess::password`] or [`NatsAccess::password_file`].
    pub user: Option<String>,
    /// `RUNYARD_NATS_PASSWORD`: that user's password.
    pub password: Option<SecretString>,
    /// `RUNYARD_NATS_PASSWORD_FILE`: a file holding it (trailing
    /// whitespace dropped); the value itself wins when both are set.
    pub password_file: Option<std::path::PathBuf>,
    /// `RUNYARD_NATS_CREDS`: a `.creds` file.
    pub creds: Option<std::path::PathBuf>,
    /// `RUNYARD_NATS_NKEY`: a file holding a user's NKey seed (`SU…`), for
    /// a server that lists the user's public key (`users: [{nkey: U…}]`).
    pub nkey: Option<std::path::PathBuf>,
    /// `RUNYARD_NATS_TLS_CA`: PEM CA certificate(s) the server's certificate
    /// is checked against; setting it requires TLS.
    pub tls_ca: Option<std::path::PathBuf>,
}

/// The variable naming the NATS user.
pub const NATS_USER_VAR: &str = "RUNYARD_NATS_USER";
/// The variable holding the NATS user's password.
pub const NATS_PASSWORD_VAR: &str = "RUNYARD_NATS_PASSWORD";
/// The variable naming a file with the NATS user's password.
pub const NATS_PASSWORD_FILE_VAR: &str = "RUNYARD_NATS_PASSWORD_FILE";
/// The variable naming a `.creds` file.
pub const NATS_CREDS_VAR: &str = "RUNYARD_NATS_CREDS";
/// The variable naming a file with an NKey seed.
pub const NATS_NKEY_VAR: &str = "RUNYARD_NATS_NKEY";
/// The variable naming the CA of a TLS NATS.
pub const NATS_TLS_CA_VAR: &str = "RUNYARD_NATS_TLS_CA";

/// The prefix of reply subjects (`_INBOX.<user>.…`) for a connection as
/// `user`: each service's replies — JetStream acks, KV reads, pulled
/// messages — come to subjects only its own user may subscribe to, so no
/// other user can read them (the shipped NATS permissions give each user
/// `_INBOX.<user>.>` alone). Without a user, or with one that is not a
/// plain subject token, the client's default `_INBOX`.
pub fn inbox_prefix(user: Option<&str>) -> String {
    match user {
        Some(u)
            if !u.is_empty()
                && u.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') =>
        {
            format!("_INBOX.{u}")
        }
        _ => "_INBOX".to_owned(),
    }
}

impl NatsAccess {
    /// `RUNYARD_NATS_USER`, `RUNYARD_NATS_PASSWORD` (or `_FILE`),
    /// `RUNYARD_NATS_CREDS`, `RUNYARD_NATS_NKEY` and `RUNYARD_NATS_TLS_CA`
    /// from the process environment (empty = unset).
    pub fn from_env() -> Self {
        // Each variable named at its `env::var` call, as
        // scripts/check-deploy.sh finds what a service reads.
        let set = |v: Result<String, std::env::VarError>| v.ok().filter(|v| !v.is_empty());
        let path = |var| {
            std::env::var_os(var)
                .filter(|v| !v.is_empty())
                .map(std::path::PathBuf::from)
        };
        Self {
            user: set(std::env::var(NATS_USER_VAR)),
            password: set(std::env::var(NATS_PASSWORD_VAR)).map(SecretString::from),
            password_file: set(std::env::var(NATS_PASSWORD_FILE_VAR)).map(std::path::PathBuf::from),
            creds: path(NATS_CREDS_VAR),
            nkey: path(NATS_NKEY_VAR),
            tls_ca: path(NATS_TLS_CA_VAR),
        }
    }

    /// The user and password given apart from the URL, if any; a user
    /// without a password (or the reverse) is an error naming the
    /// variables.
    fn login(&self) -> Result<Option<Login>, BusError> {
        let password = match (&self.password, &self.password_file) {
            (Some(p), _) => Some(p.clone()),
            (None, Some(path)) => Some(
                runyard_config::secrets::read_file(NATS_PASSWORD_FILE_VAR, path)
                    .map_err(|e| BusError::Settings(e.to_string()))?,
            ),
            (None, None) => None,
        };
        match (&self.user, password) {
            (Some(user), Some(password)) => Ok(Some(Login::UserPassword(
                user.clone(),
                password.expose_secret().to_owned(),
            ))),
            (None, None) => Ok(None),
            (Some(_), None) => Err(BusError::Settings(format!(
                "{NATS_USER_VAR} is set but neither {NATS_PASSWORD_VAR} nor \
                 {NATS_PASSWORD_FILE_VAR}: give the user's password"
            ))),
            (None, Some(_)) => Err(BusError::Settings(format!(
                "a NATS password is set ({NATS_PASSWORD_VAR} or {NATS_PASSWORD_FILE_VAR}) \
                 but no {NATS_USER_VAR}: name the user"
            ))),
        }
    }

    /// `opts` with these settings; a file that cannot be read is an error
    /// naming its variable and path.
    async fn apply(
        &self,
        mut opts: async_nats::ConnectOptions,
    ) -> Result<async_nats::ConnectOptions, BusError> {
        if let Some(ca) = &self.tls_ca {
            std::fs::metadata(ca).map_err(|e| {
                BusError::Settings(format!("{NATS_TLS_CA_VAR}: {}: {e}", ca.display()))
            })?;
            opts = opts.add_root_certificates(ca.clone()).require_tls(true);
        }
        if let Some(creds) = &self.creds {
            if self.nkey.is_some() {
                return Err(BusError::Settings(format!(
                    "{NATS_CREDS_VAR} and {NATS_NKEY_VAR} are both set: a .creds file \
                     carries its own seed; set one"
                )));
            }
            opts = opts.credentials_file(creds).await.map_err(|e| {
                BusError::Settings(format!("{NATS_CREDS_VAR}: {}: {e}", creds.display()))
            })?;
        }
        if let Some(path) = &self.nkey {
            let named = |reason: &str| {
                BusError::Settings(format!("{NATS_NKEY_VAR}: {}: {reason}", path.display()))
            };
            let text = std::fs::read_to_string(path).map_err(|e| named(&e.to_string()))?;
            // The seed alone, or the first line that is one (files made by
            // `nk -gen user` hold just the seed; some add comments).
            let seed = text
                .lines()
                .map(str::trim)
                .find(|l| l.starts_with("SU"))
                .ok_or_else(|| named("holds no user NKey seed (a line starting SU)"))?;
            // The seed is checked here so a bad one is named at start, not
            // at the first connection; its text never reaches an error.
            nkeys::KeyPair::from_seed(seed).map_err(|_| named("not a valid NKey seed"))?;
            opts = opts.nkey(seed.to_owned());
        }
        Ok(opts)
    }
}

/// Credentials taken from a NATS URL's userinfo or from [`NatsAccess`].
enum Login {
    /// `nats://user:password@host`, or `RUNYARD_NATS_USER` and
    /// `RUNYARD_NATS_PASSWORD`.
    UserPassword(String, String),
    /// `nats://token@host`.
    Token(String),
}

/// The servers of `url` (several: comma-separated) with their userinfo
/// taken out, and the credentials the first one with userinfo carried
/// (percent-decoded).
fn server_addrs(url: &str) -> Result<(Vec<async_nats::ServerAddr>, Option<Login>), BusError> {
    let decode = |s: &str| {
        percent_encoding::percent_decode_str(s)
            .decode_utf8_lossy()
            .into_owned()
    };
    let mut addrs = Vec::new();
    let mut login = None;
    for part in url.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let addr: async_nats::ServerAddr = part.parse().map_err(|e| {
            BusError::Settings(format!(
                "RUNYARD_NATS_URL: {}: {e}",
                runyard_config::redact::urls(part)
            ))
        })?;
        if login.is_none()
            && let Some(user) = addr.username()
        {
            login = Some(match addr.password() {
                Some(password) => Login::UserPassword(decode(user), decode(password)),
                None => Login::Token(decode(user)),
            });
        }
        addrs.push(without_userinfo(addr)?);
    }
    if addrs.is_empty() {
        return Err(BusError::Settings(
            "RUNYARD_NATS_URL: no server given".to_owned(),
        ));
    }
    Ok((addrs, login))
}

/// `addr` without user and password: the client would log them with the
/// address, and it takes them from the connect options anyway.
fn without_userinfo(addr: async_nats::ServerAddr) -> Result<async_nats::ServerAddr, BusError> {
    if !addr.has_user_pass() && addr.password().is_none() {
        return Ok(addr);
    }
    let mut url = addr.into_inner();
    let cleared = url.set_username("").is_ok() && url.set_password(None).is_ok();
    if !cleared {
        return Err(BusError::Settings(
            "RUNYARD_NATS_URL: a server address that cannot carry credentials".to_owned(),
        ));
    }
    async_nats::ServerAddr::from_url(url)
        .map_err(|e| BusError::Settings(format!("RUNYARD_NATS_URL: {e}")))
}

/// The servers of `url` without any credentials, for a client that must
/// connect as nobody (`runyard doctor`'s check that NATS refuses that).
pub fn anonymous_addrs(url: &str) -> Result<Vec<async_nats::ServerAddr>, BusError> {
    server_addrs(url).map(|(addrs, _)| addrs)
}

/// The connect options and server addresses for `url` and `access`, as
/// every runyard process connects: credentials (from the URL or from
/// `access`, never both) as options, the servers without userinfo, the
/// user's own reply subjects ([`inbox_prefix`]) and the connection
/// `name`. Callers add their own timeouts and reconnect behaviour.
pub async fn connect_options(
    url: &str,
    name: &str,
    access: &NatsAccess,
) -> Result<(async_nats::ConnectOptions, Vec<async_nats::ServerAddr>), BusError> {
    let (addrs, in_url) = server_addrs(url)?;
    let apart = access.login()?;
    let login = match (in_url, apart) {
        (Some(_), Some(_)) => {
            return Err(BusError::Settings(format!(
                "credentials in both RUNYARD_NATS_URL and {NATS_USER_VAR}: give them one way"
            )));
        }
        (a, b) => a.or(b),
    };
    let mut opts = async_nats::ConnectOptions::new().name(name);
    match login {
        Some(Login::UserPassword(user, password)) => {
            opts = opts
                .custom_inbox_prefix(inbox_prefix(Some(&user)))
                .user_and_password(user, password);
        }
        Some(Login::Token(token)) => opts = opts.token(token),
        None => {}
    }
    Ok((access.apply(opts).await?, addrs))
}

/// A connection to the event log of one namespace.
#[derive(Clone, Debug)]
pub struct Bus {
    client: async_nats::Client,
    js: jetstream::Context,
    ns: Namespace,
    ack_timeout: Duration,
}

impl Bus {
    /// Connects to `url` (several: comma-separated) with the
    /// [`NatsAccess`] the environment gives. With `wait_for_server`, a
    /// server that is down at start is retried in the background instead of
    /// failing (the client reports disconnected until it is up).
    pub async fn connect(
        url: &str,
        ns: Namespace,
        name: &str,
        wait_for_server: bool,
    ) -> Result<Self, BusError> {
        Self::connect_with(url, ns, name, wait_for_server, &NatsAccess::from_env()).await
    }

    /// [`Bus::connect`] with `access` instead of the environment's.
    pub async fn connect_with(
        url: &str,
        ns: Namespace,
        name: &str,
        wait_for_server: bool,
        access: &NatsAccess,
    ) -> Result<Self, BusError> {
        let (opts, addrs) = connect_options(url, name, access).await?;
        let mut opts = opts
            .connection_timeout(Duration::from_secs(5))
            // Reconnect forever with a capped back-off: a service must outlive
            // a NATS restart without being restarted itself.
            .max_reconnects(None)
            .reconnect_delay_callback(|attempts| {
                Duration::from_millis(
                    (50 * 2u64.saturating_pow(attempts.min(10) as u32)).min(2_000),
                )
            })
            .event_callback(|event| async move {
                tracing::info!(%event, "nats connection event");
            });
        if wait_for_server {
            opts = opts.retry_on_initial_connect();
        }
        let client = opts
            .connect(addrs)
            .await
            .map_err(|source| BusError::Connect {
                url: runyard_config::redact::urls(url),
                source,
            })?;
        Ok(Self::from_client(client, ns))
    }

    /// Wraps an existing client.
    pub fn from_client(client: async_nats::Client, ns: Namespace) -> Self {
        let ack_timeout = Duration::from_secs(5);
        let js = jetstream::ContextBuilder::new()
            .timeout(ack_timeout)
            .max_ack_inflight(8192)
            .backpressure_on_inflight(true)
            .build(client.clone());
        Self {
            client,
            js,
            ns,
            ack_timeout,
        }
    }

    /// Sets how long a publish waits for JetStream's ack.
    pub fn with_ack_timeout(mut self, timeout: Duration) -> Self {
        self.ack_timeout = timeout;
        self.js = jetstream::ContextBuilder::new()
            .timeout(timeout)
            .max_ack_inflight(8192)
            .backpressure_on_inflight(true)
            .build(self.client.clone());
        self
    }

    /// The namespace.
    pub fn namespace(&self) -> &Namespace {
        &self.ns
    }

    /// The underlying client.
    pub fn client(&self) -> &async_nats::Client {
        &self.client
    }

    /// The JetStream context.
    pub fn jetstream(&self) -> &jetstream::Context {
        &self.js
    }

    /// True while the client holds a connection.
    pub fn is_connected(&self) -> bool {
        self.client.connection_state() == async_nats::connection::State::Connected
    }

    /// The server's `max_payload`.
    pub fn max_payload(&self) -> usize {
        self.client.server_info().max_payload
    }

    /// Creates the namespace's streams, or brings an existing stream's
    /// settings in line with `settings`. Safe to call from every replica on
    /// every start.
    pub async fn ensure_streams(&self, settings: &StreamSettings) -> Result<(), BusError> {
        for wanted in self.stream_configs(settings) {
            self.reconcile_stream(wanted).await?;
        }
        Ok(())
    }

    fn stream_configs(&self, settings: &StreamSettings) -> [stream::Config; 2] {
        let config = |name: String,
                      subject: String,
                      max_age: Duration,
                      max_bytes: u64,
                      discard: stream::DiscardPolicy| stream::Config {
            name,
            subjects: vec![subject],
            storage: stream::StorageType::File,
            retention: stream::RetentionPolicy::Limits,
            max_age,
            // JetStream's "no limit" is -1.
            max_bytes: match max_bytes {
                0 => -1,
                n => i64::try_from(n).unwrap_or(i64::MAX),
            },
            discard,
            duplicate_window: settings.duplicate_window.min(max_age),
            num_replicas: settings.replicas,
            allow_direct: true,
            ..Default::default()
        };
        [
            config(
                self.ns.events_stream(),
                self.ns.all_events(),
                settings.events_max_age,
                settings.events_max_bytes,
                stream::DiscardPolicy::New,
            ),
            config(
                self.ns.raw_stream(),
                self.ns.all_raw(),
                settings.raw_max_age,
                settings.raw_max_bytes,
                stream::DiscardPolicy::Old,
            ),
        ]
    }

    /// Creates the streams only where they are missing, leaving existing
    /// settings alone: for consumers, so they never fight ingest (which owns
    /// retention settings) over them.
    pub async fn create_streams_if_missing(
        &self,
        settings: &StreamSettings,
    ) -> Result<(), BusError> {
        for wanted in self.stream_configs(settings) {
            self.js
                .get_or_create_stream(wanted)
                .await
                .map_err(|e| nats_err("creating stream", e))?;
        }
        Ok(())
    }

    /// Creates the event stream only where it is missing, leaving an
    /// existing one alone: what a consumer does at start. It needs (and,
    /// under the shipped NATS permissions, may create) the event stream
    /// alone; the raw-delivery stream is ingest's.
    pub async fn create_events_stream_if_missing(
        &self,
        settings: &StreamSettings,
    ) -> Result<(), BusError> {
        let [events, _raw] = self.stream_configs(settings);
        self.js
            .get_or_create_stream(events)
            .await
            .map_err(|e| nats_err("creating stream", e))?;
        Ok(())
    }

    async fn reconcile_stream(&self, wanted: stream::Config) -> Result<(), BusError> {
        let mut existing = self
            .js
            .get_or_create_stream(wanted.clone())
            .await
            .map_err(|e| nats_err("creating stream", e))?;
        let info = existing
            .info()
            .await
            .map_err(|e| nats_err("reading stream info", e))?;
        let have = &info.config;
        let differs = have.subjects != wanted.subjects
            || have.max_age != wanted.max_age
            || have.max_bytes != wanted.max_bytes
            || have.discard != wanted.discard
            || have.duplicate_window != wanted.duplicate_window
            || have.num_replicas != wanted.num_replicas
            || have.allow_direct != wanted.allow_direct;
        if differs {
            tracing::info!(stream = %wanted.name, "updating stream settings");
            // Keep server-assigned fields the update may not change.
            let update = stream::Config {
                storage: have.storage,
                ..wanted
            };
            self.js
                .update_stream(update)
                .await
                .map_err(|e| nats_err("updating stream", e))?;
        }
        Ok(())
    }

    /// True when both streams of the namespace exist (asks the server).
    pub async fn streams_exist(&self) -> bool {
        for name in [self.ns.events_stream(), self.ns.raw_stream()] {
            let probe = tokio::time::timeout(Duration::from_secs(1), self.js.get_stream(&name));
            match probe.await {
                Ok(Ok(_)) => {}
                _ => return false,
            }
        }
        true
    }

    /// Publishes an event on its subject with `Nats-Msg-Id` = the event id,
    /// `traceparent` and `Runyard-Event-Type`, and awaits the ack.
    pub async fn publish_event(
        &self,
        event: &Event,
        traceparent: &TraceParent,
    ) -> Result<Stored, BusError> {
        let msg = self.prepare_event(event, &traceparent.header_value())?;
        self.publish_prepared(msg).await
    }

    /// Encodes an event as an [`Outgoing`] message (subject from the body).
    /// [`Bus::prepare_event`] gives the same message, cheaper to publish.
    pub fn event_message(
        &self,
        event: &Event,
        traceparent: &TraceParent,
    ) -> Result<Outgoing, BusError> {
        Ok(Outgoing {
            subject: self.event_subject(event)?,
            id: event.id.clone(),
            headers: vec![
                (TRACEPARENT_HEADER.into(), traceparent.to_string()),
                (EVENT_TYPE_HEADER.into(), event_type(event).into()),
            ],
            payload: Bytes::from(event.encode_to_vec()),
        })
    }

    /// Encodes an event as a [`Prepared`] message (subject from the body)
    /// with `Nats-Msg-Id` = the event id, `traceparent` and
    /// `Runyard-Event-Type`. `traceparent` is a
    /// [`TraceParent::header_value`], made once for all the messages of one
    /// delivery.
    pub fn prepare_event(
        &self,
        event: &Event,
        traceparent: &HeaderValue,
    ) -> Result<Prepared, BusError> {
        let mut msg = Prepared::new(
            self.event_subject(event)?,
            &event.id,
            Bytes::from(event.encode_to_vec()),
        );
        msg.headers.insert(TRACEPARENT, traceparent.clone());
        msg.headers.insert(EVENT_TYPE, event_type(event));
        Ok(msg)
    }

    fn event_subject(&self, event: &Event) -> Result<String, BusError> {
        self.ns.subject_for(event).ok_or(BusError::Nats {
            context: "routing event",
            source: "event has no source or body".into(),
        })
    }

    /// Publishes one message and awaits JetStream's ack (bounded by the ack
    /// timeout). Fails fast when disconnected, so callers never wait on a
    /// message sitting in the client's buffer.
    pub async fn publish(&self, msg: Outgoing) -> Result<Stored, BusError> {
        self.publish_prepared(msg.into()).await
    }

    /// [`Bus::publish`] for a message whose headers are already built.
    pub async fn publish_prepared(&self, msg: Prepared) -> Result<Stored, BusError> {
        if !self.is_connected() {
            return Err(BusError::Disconnected);
        }
        let size = msg.payload.len();
        let publish = PublishMessage::build()
            .headers(msg.headers)
            .payload(msg.payload);
        let timeout = self.ack_timeout;
        let fut = async {
            let ack_future = self
                .js
                .send_publish(msg.subject, publish)
                .await
                .map_err(|e| classify_publish(e, size, timeout))?;
            ack_future
                .await
                .map_err(|e| classify_publish(e, size, timeout))
        };
        let ack = tokio::time::timeout(timeout, fut)
            .await
            .map_err(|_| BusError::AckTimeout(timeout))??;
        Ok(Stored {
            sequence: ack.sequence,
            duplicate: ack.duplicate,
        })
    }
}

impl Bus {
    /// Publishes `msgs` in order and asks JetStream to acknowledge only the
    /// last. The server takes one connection's messages in order, so that
    /// ack says the stream has taken in the whole batch: an ack per message
    /// costs the client (reply inbox, ack parsing) and nats-server alike. The
    /// price is not hearing about one earlier message the stream refused on
    /// its own (too large, a duplicate id), so this is for events whose
    /// occasional loss is tolerable. `Ok(None)` for an empty batch; the
    /// last message's [`Stored`] otherwise.
    pub async fn publish_confirming_last(
        &self,
        msgs: impl IntoIterator<Item = Prepared>,
    ) -> Result<Option<Stored>, BusError> {
        let mut msgs = msgs.into_iter().peekable();
        if msgs.peek().is_none() {
            return Ok(None);
        }
        if !self.is_connected() {
            return Err(BusError::Disconnected);
        }
        let mut sent = 0_usize;
        while let Some(msg) = msgs.next() {
            if msgs.peek().is_none() {
                return self.publish_prepared(msg).await.map(Some);
            }
            self.client
                .publish_with_headers(msg.subject, msg.headers, msg.payload)
                .await
                .map_err(|e| nats_err("publishing", e))?;
            sent += 1;
            if sent.is_multiple_of(YIELD_EVERY) {
                tokio::task::yield_now().await;
            }
        }
        Ok(None)
    }
}

/// How many messages of a batch [`Bus::publish_confirming_last`] sends (and
/// its iterator builds) before letting the worker thread run other tasks: a
/// large batch must not hold up the requests of the service that publishes.
const YIELD_EVERY: usize = 32;

fn classify_publish(
    e: jetstream::context::PublishError,
    size: usize,
    timeout: Duration,
) -> BusError {
    use jetstream::context::PublishErrorKind as K;
    match e.kind() {
        K::TimedOut => BusError::AckTimeout(timeout),
        K::MaxPayloadExceeded => BusError::TooLarge(size),
        K::BrokenPipe => BusError::Disconnected,
        K::Other if stream_full(&e) => BusError::StreamFull,
        _ => nats_err("publishing", e),
    }
}

/// Whether JetStream refused a message because its stream is at
/// `max_bytes`: a store failure (10077) whose description says so — the
/// server gives that refusal no code of its own, and the client keeps the
/// description private, so its text is the only witness. Read here once,
/// so callers match [`BusError::StreamFull`].
fn stream_full(e: &jetstream::context::PublishError) -> bool {
    std::error::Error::source(e)
        .and_then(|s| s.downcast_ref::<jetstream::Error>())
        .is_some_and(|api| {
            api.error_code() == jetstream::ErrorCode::STREAM_STORE_FAILED
                && api.to_string().contains("maximum bytes exceeded")
        })
}

fn nats_err(context: &'static str, e: impl Into<async_nats::Error>) -> BusError {
    BusError::Nats {
        context,
        source: e.into(),
    }
}

#[cfg(test)]
mod redaction_tests {
    use super::*;

    #[test]
    fn server_addresses_go_to_the_client_without_credentials() {
        let (addrs, login) =
            server_addrs("nats://ingest:pa%40ss-w0rd@n1:4222,nats://t0ken@n2:4222").unwrap();
        // The client logs its addresses with `{:?}` on every attempt.
        let shown = format!("{addrs:?}");
        for addr in &addrs {
            assert_eq!((addr.username(), addr.password()), (None, None), "{shown}");
        }
        assert!(
            !shown.contains("pa%40ss") && !shown.contains("t0ken"),
            "{shown}"
        );
        assert_eq!(addrs[0].host(), "n1");
        assert_eq!(addrs[1].port(), 4222);
        // The first userinfo is the login, percent-decoded.
        assert!(
            matches!(login, Some(Login::UserPassword(ref u, ref p)) if u == "ingest" && p == "pa@ss-w0rd")
        );
    }

    #[test]
    fn each_user_takes_its_replies_under_its_own_inbox() {
        assert_eq!(inbox_prefix(Some("job-tracker")), "_INBOX.job-tracker");
        assert_eq!(inbox_prefix(Some("scaler")), "_INBOX.scaler");
        // Not a subject token: the default.
        assert_eq!(inbox_prefix(Some("a.b")), "_INBOX");
        assert_eq!(inbox_prefix(Some("a b")), "_INBOX");
        assert_eq!(inbox_prefix(Some("")), "_INBOX");
        assert_eq!(inbox_prefix(None), "_INBOX");
    }

    #[tokio::test]
    async fn credentials_come_one_way_and_whole() {
        let apart = NatsAccess {
            user: Some("scaler".into()),
            password: Some(SecretString::from("pw")),
            ..NatsAccess::default()
        };
        let both = connect_options("nats://ingest:pw@h:4222", "t", &apart)
            .await
            .expect_err("credentials in the URL and apart");
        assert!(both.to_string().contains("RUNYARD_NATS_USER"), "{both}");
        let no_password = NatsAccess {
            user: Some("scaler".into()),
            ..NatsAccess::default()
        };
        let e = connect_options("nats://h:4222", "t", &no_password)
            .await
            .expect_err("a user without a password");
        assert!(e.to_string().contains("RUNYARD_NATS_PASSWORD"), "{e}");
        let no_user = NatsAccess {
            password: Some(SecretString::from("pw")),
            ..NatsAccess::default()
        };
        let e = connect_options("nats://h:4222", "t", &no_user)
            .await
            .expect_err("a password without a user");
        assert!(e.to_string().contains("RUNYARD_NATS_USER"), "{e}");
        assert!(connect_options("nats://h:4222", "t", &apart).await.is_ok());
    }

    #[tokio::test]
    async fn a_connect_error_does_not_carry_the_password() {
        let ns = Namespace::new("redact".to_owned()).expect("namespace");
        // Nothing listens on port 1.
        let err = Bus::connect("nats://user:s3cret@127.0.0.1:1", ns, "test", false)
            .await
            .expect_err("nothing listens there");
        let text = format!("{err} / {err:?}");
        assert!(!text.contains("s3cret"), "{text}");
        assert!(text.contains("user:***@127.0.0.1:1"), "{text}");
    }
}
