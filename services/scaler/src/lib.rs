//! runyard scaler: keeps pools of CI runners at the size the queue needs.
//! It folds job and runner events from the log into its view of the world,
//! holds a lease per pool so exactly one replica acts on it, creates a
//! right-sized runner per queued job (claimed once, named deterministically)
//! and removes runners that are done, idle past their time or never came up.

mod background;
pub mod config;
pub mod core;
pub mod engine;
pub mod forges;
mod io;
pub mod kv;
pub mod metadata;
mod metrics;
mod progress;
pub mod provider;
mod reconciler;
mod retry;
pub mod scaleset;
pub mod simulate;
pub mod sizing;

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use anyhow::Context as _;
use axum::extract::State as AxumState;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use runyard_bus::consumer::{Consumer, ConsumerConfig, Deliver, Delivery, Handler, HandlerError};
use runyard_bus::{Bus, StreamSettings};
use runyard_events::{Forge, Namespace};
use runyard_forge::api::github::{GitHubAuth, GitHubClient};
use runyard_forge::api::gitlab::GitLabClient;
use runyard_telemetry::Metrics;
use secrecy::SecretString;
use serde_json::json;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use uuid::Uuid;

use crate::core::policy::PoolSpec;
pub use config::{Config, ScalerFile};
use engine::{Engine, Pool, Shared};
use forges::Forges;
use kv::Coordination;
use metrics::ScalerMetrics;
use provider::Provider;
pub use runyard_provider::{controller_id, pool_id};
use sizing::Allocator;

/// Creates (forge registration and provider create) under way at once:
/// bounds the forge's concurrent requests and the host's process spawning
/// in a burst; the rest wait their turn in order.
const CREATES_IN_FLIGHT: usize = 64;

/// A built scaler: configuration checked, connected, listening.
#[derive(Debug)]
pub struct App {
    shared: Arc<Shared>,
    registry: Metrics,
    listener: runyard_tls::Listener,
    /// The instance callback/metadata API's listener (with a token key).
    metadata_listener: Option<runyard_tls::Listener>,
    reconciler: Option<reconciler::Reconciler>,
    retrier: retry::Retrier,
}

fn forge_host(pool: &config::PoolConfig, config: &Config) -> String {
    if let Some(i) = &pool.instance {
        return i.clone();
    }
    if pool.forge == Forge::Gitlab {
        return config
            .gitlab_api_url
            .as_deref()
            .and_then(|u| u.split("://").nth(1))
            .map(|rest| rest.split(['/', ':']).next().unwrap_or(rest).to_owned())
            .unwrap_or_else(|| "gitlab.com".into());
    }
    "github.com".into()
}

/// A credential file named by `var` (the shared `*_FILE` rule).
fn read_secret(var: &str, path: &std::path::Path) -> anyhow::Result<SecretString> {
    Ok(runyard_config::secrets::read_file(var, path)?)
}

fn forges(config: &Config, file: &ScalerFile) -> anyhow::Result<Forges> {
    let timeout = file.scaler.forge_timeout;
    let gh = file.github.clone().unwrap_or_default();
    let app_id = config.github_app_id.or(gh.app_id);
    let key_file = config
        .github_app_private_key_file
        .clone()
        .or(gh.private_key_file);
    let app = match (app_id, key_file) {
        (Some(app_id), Some(key)) => Some(GitHubAuth::App {
            app_id,
            private_key_pem: read_secret("RUNYARD_GITHUB_APP_PRIVATE_KEY_FILE", &key)?,
            installation_id: config.github_app_installation_id.or(gh.installation_id),
        }),
        _ => None,
    };
    let pat = config.github_token.clone().map(GitHubAuth::Token);
    // GitHub's enterprise runner endpoints refuse installation tokens and
    // there is no enterprise installation to find: an enterprise pool
    // needs the personal access token.
    if app.is_some()
        && pat.is_none()
        && let Some(pool) = file
            .pools
            .iter()
            .find(|p| p.forge == Forge::Github && p.scope.enterprise.is_some())
    {
        anyhow::bail!(
            "pool {:?} is enterprise-scoped but only GitHub App credentials are configured: a GitHub App cannot manage enterprise runners (there is no enterprise installation, and enterprise runner endpoints refuse installation tokens); set RUNYARD_GITHUB_TOKEN to a classic personal access token with manage_runners:enterprise",
            pool.name
        );
    }
    let client =
        |auth| GitHubClient::new(&config.github_api_url, auth, timeout).context("GitHub client");
    // With both, the App serves every pool but enterprise ones, which the
    // token serves.
    let (github, github_pat) = match (app, pat) {
        (Some(app), Some(pat)) => (Some(client(app)?), Some(client(pat)?)),
        (Some(auth), None) | (None, Some(auth)) => (Some(client(auth)?), None),
        (None, None) => (None, None),
    };
    let gl = file.gitlab.clone().unwrap_or_default();
    let gitlab_url = config.gitlab_api_url.clone().or(gl.api_url);
    let gitlab_token = match (&config.gitlab_token, gl.token_file) {
        (Some(t), _) => Some(t.clone()),
        (None, Some(f)) => Some(read_secret("[gitlab] token_file", &f)?),
        _ => None,
    };
    let gitlab = match (gitlab_url, gitlab_token) {
        (Some(url), Some(token)) => {
            Some(GitLabClient::new(&url, token, timeout).context("GitLab client")?)
        }
        _ => None,
    };
    Ok(Forges {
        github,
        github_pat,
        gitlab,
        rate_limit_probe: file.scaler.rate_limit_probe,
        waiting: Arc::default(),
        scale_sets: Arc::default(),
    })
}

/// The runner scale set of every `scale-set` pool, with an Actions
/// service client on the pool's GitHub credentials.
fn scale_sets(
    config: &Config,
    file: &ScalerFile,
    forges: &Forges,
) -> anyhow::Result<HashMap<String, Arc<scaleset::ScaleSet>>> {
    use runyard_forge::api::ClientOptions;
    use runyard_forge::api::scaleset::ActionsClient;
    let mut sets = HashMap::new();
    for pool in &file.pools {
        let Some(name) = pool.scale_set() else {
            continue;
        };
        let github = forges
            .github_for(&pool.scope)
            .with_context(|| format!("pool {:?} (scale-set mode)", pool.name))?
            .clone();
        let scope = forges::github_scope(&pool.scope);
        let host = forge_host(pool, config);
        let config_url = format!("https://{host}/{}", scope_path(&pool.scope));
        let client = ActionsClient::new(
            github,
            scope,
            &config_url,
            &config.github_api_url,
            &ClientOptions::new(file.scaler.forge_timeout),
        )
        .with_context(|| format!("pool {:?}: Actions service client", pool.name))?;
        sets.insert(
            pool.name.clone(),
            Arc::new(scaleset::ScaleSet::new(
                &pool.name,
                name,
                pool.scale_set_labels(),
                pool.runner_group.clone(),
                client,
            )),
        );
    }
    Ok(sets)
}

/// The path of a GitHub scope's configuration URL: `org`, `owner/repo` or
/// `enterprises/slug`.
fn scope_path(scope: &config::Scope) -> String {
    if let Some(repo) = &scope.repo {
        repo.clone()
    } else if let Some(org) = &scope.org {
        org.clone()
    } else {
        format!(
            "enterprises/{}",
            scope.enterprise.clone().unwrap_or_default()
        )
    }
}

/// Makes sure of every scale set at start: a label change the service
/// cannot apply, or a runner group that does not exist, refuses to start;
/// a service that cannot be reached now is retried by the listener.
/// The scale sets are checked together: a service that does not answer
/// delays the start by `3 × timeout` once, not once per pool.
async fn ensure_scale_sets(forges: &Forges, timeout: Duration) -> anyhow::Result<()> {
    let checks = forges.scale_sets.values().map(|set| async move {
        match tokio::time::timeout(timeout * 3, set.ensure()).await {
            Ok(Ok(id)) => {
                tracing::info!(pool = %set.pool, scale_set = %set.name, id, "runner scale set ready");
                Ok(())
            }
            Ok(Err(e)) if e.is_permanent() => Err(e),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, pool = %set.pool, "the runner scale set cannot be checked now; the listener tries again");
                Ok(())
            }
            Err(_) => {
                tracing::warn!(pool = %set.pool, "the Actions service did not answer in time; the listener tries again");
                Ok(())
            }
        }
    });
    for outcome in futures::future::join_all(checks).await {
        outcome?;
    }
    Ok(())
}

/// Brings the forge call counters up to the clients' totals: GitHub's REST
/// clients and every scale set's Actions service client summed under
/// `github`, GitLab's under `gitlab`.
fn record_forge_calls(io: &io::Io) {
    let rest = io.forges.github.iter().chain(&io.forges.github_pat);
    let actions = io.forges.scale_sets.values().map(|set| set.client.calls());
    let mut github: Option<runyard_forge::api::CallCounts> = None;
    for counts in rest.map(|gh| gh.calls()).chain(actions) {
        let totals = github.get_or_insert_with(Default::default);
        for (endpoint, n) in counts.calls {
            *totals.calls.entry(endpoint).or_default() += n;
        }
    }
    if let Some(totals) = &github {
        io.metrics.record_forge_calls("github", totals);
    }
    if let Some(gl) = &io.forges.gitlab {
        io.metrics.record_forge_calls("gitlab", &gl.calls());
    }
}

/// Tokens, the secret store and the URLs instances are given, when the
/// instance token key is set; external providers need them.
async fn metadata_parts(
    config: &Config,
    file: &ScalerFile,
    bus: &Bus,
) -> anyhow::Result<Option<metadata::Metadata>> {
    let external = file
        .providers
        .values()
        .any(|p| matches!(p, config::ProviderConfig::External { .. }));
    let Some(key) = &config.scaler_instance_token_key else {
        anyhow::ensure!(
            !external,
            "RUNYARD_SCALER_INSTANCE_TOKEN_KEY (or _FILE) is required with external providers: it signs the instance tokens"
        );
        return Ok(None);
    };
    let keep = file
        .pools
        .iter()
        .map(|p| p.bootstrap_timeout)
        .max()
        .unwrap_or_default()
        .max(Duration::from_secs(3600));
    let store =
        wait_for(|| metadata::SecretStore::open_replicated(bus, keep, config.streams.replicas))
            .await
            .context("opening the instance secrets bucket")?;
    let base = match &config.scaler_metadata_url {
        Some(url) => url.clone(),
        None => {
            let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
                .or_else(|_| std::fs::read_to_string("/etc/hostname"))
                .map(|h| h.trim().to_owned())
                .ok()
                .filter(|h| !h.is_empty())
                .unwrap_or_else(|| "localhost".into());
            format!("http://{host}:{}", config.scaler_metadata_listen.port())
        }
    };
    Ok(Some(metadata::Metadata::new(
        metadata::InstanceTokens::new(key),
        store,
        &base,
    )))
}

/// Binds the HTTP listener and, when the metadata API is served, its own;
/// over TLS when `RUNYARD_SCALER_TLS_CERT` and `_KEY` are set (the files
/// read again whenever they change). A client CA makes the HTTP listener
/// want client certificates; the metadata listener never asks for one:
/// instances authenticate with their token.
async fn bind_listeners(
    config: &Config,
    metadata: bool,
) -> anyhow::Result<(runyard_tls::Listener, Option<runyard_tls::Listener>)> {
    use runyard_tls::{ClientAuth, Protocols, ServerTls};
    let tls = ServerTls::from_settings(
        "SCALER",
        config.tls.cert.as_deref(),
        config.tls.key.as_deref(),
        config.tls.client_ca.as_deref(),
    )?;
    let acceptor = |client_auth| {
        tls.as_ref()
            .map(|t| t.acceptor(client_auth, Protocols::Http))
            .transpose()
    };
    let listener = TcpListener::bind(config.scaler_http_listen)
        .await
        .with_context(|| format!("binding {}", config.scaler_http_listen))?;
    let listener = runyard_tls::Listener::new(listener, acceptor(ClientAuth::Required)?);
    if !metadata {
        return Ok((listener, None));
    }
    let addr = config.scaler_metadata_listen;
    let metadata = TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding {addr}"))?;
    tracing::info!(addr = %metadata.local_addr()?, "instance metadata API listening");
    let metadata = runyard_tls::Listener::new(metadata, acceptor(ClientAuth::Never)?);
    Ok((listener, Some(metadata)))
}

/// The scaler's TLS settings for an `https://` `RUNYARD_ALLOCATOR_URL`
/// (`RUNYARD_ALLOCATOR_CA_FILE`, `_CLIENT_CERT`, `_CLIENT_KEY`); none set →
/// tonic's defaults (the public roots for https). Files given with a
/// plaintext URL refuse to start: the operator meant TLS.
fn allocator_tls(config: &Config) -> anyhow::Result<Option<tonic::transport::ClientTlsConfig>> {
    let files = runyard_tls::ClientFiles::new(
        config.allocator_ca_file.as_deref(),
        config.allocator_client_cert.as_deref(),
        config.allocator_client_key.as_deref(),
    )?;
    if files.is_empty() {
        return Ok(None);
    }
    anyhow::ensure!(
        config.allocator_url.starts_with("https://"),
        "{}, {} or {} is set but RUNYARD_ALLOCATOR_URL is not an https:// URL",
        runyard_tls::CA_FILE_VAR,
        runyard_tls::CLIENT_CERT_VAR,
        runyard_tls::CLIENT_KEY_VAR
    );
    Ok(Some(files.grpc()?))
}

impl App {
    /// Checks the configuration, connects to NATS and binds the listener.
    /// `file` overrides `RUNYARD_SCALER_CONFIG` (tests pass it in).
    pub async fn build(config: Config, file: Option<ScalerFile>) -> anyhow::Result<Self> {
        // Boxed: building holds much across its awaits.
        Box::pin(Self::build_boxed(config, file)).await
    }

    async fn build_boxed(config: Config, file: Option<ScalerFile>) -> anyhow::Result<Self> {
        config.check_secrets()?;
        let file = match (file, &config.scaler_config) {
            (Some(f), _) => f,
            (None, Some(path)) => ScalerFile::load(path)
                .with_context(|| format!("scaler configuration {}", path.display()))?,
            (None, None) => {
                tracing::warn!("RUNYARD_SCALER_CONFIG is not set: no pools to scale");
                ScalerFile::default()
            }
        };
        file.validate().context("scaler configuration")?;
        let allocator_tls = allocator_tls(&config)?;
        let ns = Namespace::new(config.bus.namespace.clone())?;
        let controller = controller_id(&ns);
        let state_dir: PathBuf = file.scaler.state_dir.clone().unwrap_or_else(|| {
            std::env::temp_dir().join(format!("runyard-scaler-{}", ns.as_str()))
        });
        let mut pools = HashMap::new();
        let mut specs = Vec::new();
        for p in &file.pools {
            let provider_config = &file.providers[&p.provider];
            let labels = if p.scale_set().is_some() {
                p.scale_set_labels()
            } else {
                p.labels.clone()
            };
            let spec = PoolSpec {
                name: p.name.clone(),
                forge: p.forge,
                instance: forge_host(p, &config),
                labels: labels.iter().map(|l| l.to_ascii_lowercase()).collect(),
                min_idle: p.min_idle,
                max_runners: p.max_runners,
                idle_timeout: p.idle_timeout,
                bootstrap_timeout: p.bootstrap_timeout,
                priority: p.priority,
                repos: None,
                scale_set: p.scale_set().is_some(),
            };
            specs.push(spec.clone());
            pools.insert(
                p.name.clone(),
                Arc::new(Pool {
                    config: p.clone(),
                    spec,
                    id: pool_id(&controller, &p.name).to_string(),
                    provider: Provider::from_config(
                        &p.provider,
                        provider_config,
                        &controller.to_string(),
                        &state_dir,
                    ),
                    provider_name: p.provider.clone(),
                }),
            );
        }
        let mut forges = forges(&config, &file)?;
        forges.scale_sets = Arc::new(scale_sets(&config, &file, &forges)?);
        ensure_scale_sets(&forges, file.scaler.forge_timeout).await?;
        let admitted = forges
            .check_runner_groups(&file.pools)
            .await
            .context("runner groups")?;
        for spec in &mut specs {
            spec.repos = admitted.get(&spec.name).cloned();
        }
        let bus = Bus::connect(&config.bus.nats_url, ns, "runyard-scaler", true).await?;
        let replica = format!(
            "{}-{}",
            std::process::id(),
            &Uuid::new_v4().simple().to_string()[..8]
        );
        let coord = wait_for(|| {
            Coordination::open_replicated(
                &bus,
                file.scaler.lease_ttl,
                replica.clone(),
                config.streams.replicas,
            )
        })
        .await
        .context("opening the lease and claim buckets")?;
        let db = sqlx::postgres::PgPoolOptions::new()
            .max_connections(8)
            // A check that cannot get a connection at once is skipped: the
            // log's view decides then (see `already_started`).
            .acquire_timeout(Duration::from_millis(250))
            .connect_lazy(&config.database.url)
            .ok();
        let metadata = Box::pin(self::metadata_parts(&config, &file, &bus)).await?;
        let registry = Metrics::new();
        let metrics = ScalerMetrics::register(&registry);
        let provider_names: Vec<&str> = file.providers.keys().map(String::as_str).collect();
        let pool_names: Vec<&str> = file.pools.iter().map(|p| p.name.as_str()).collect();
        metrics.init(&provider_names, &pool_names);
        let scale_set_pools: Vec<&str> = file
            .pools
            .iter()
            .filter(|p| p.scale_set().is_some())
            .map(|p| p.name.as_str())
            .collect();
        metrics.init_scale_sets(
            &scale_set_pools,
            time::OffsetDateTime::now_utc().unix_timestamp(),
        );
        let (listener, metadata_listener) =
            Box::pin(bind_listeners(&config, metadata.is_some())).await?;
        tracing::info!(addr = %listener.local_addr()?, namespace = %bus.namespace(), %replica, pools = specs.len(), "scaler listening");
        let io = Arc::new(io::Io {
            bus,
            coord,
            forges,
            allocator: Allocator::with_tls(
                &config.allocator_url,
                config.allocator_client_token.clone(),
                file.scaler.allocator_timeout,
                allocator_tls,
            ),
            lineage: retry::Lineage::default(),
            db,
            timers: file.scaler.clone(),
            metrics,
            db_down_until: std::sync::Mutex::new(None),
            create_slots: tokio::sync::Semaphore::new(CREATES_IN_FLIGHT),
        });
        let shared = Arc::new(Shared {
            io: io.clone(),
            pools: Arc::new(pools),
            specs,
            status: RwLock::new(Vec::new()),
            queue: RwLock::default(),
            progress: progress::Progress::default(),
            metadata,
            owned: Arc::default(),
        });
        // Every endpoint's series exists from the start, at zero.
        record_forge_calls(&io);
        // Forge clients of its own: its calls are budgeted and counted apart.
        let reconciler = match &file.reconciler {
            Some(section) => Some(reconciler::Reconciler::new(
                section.clone(),
                self::forges(&config, &file)?,
                io.clone(),
                &shared.specs,
                &config.github_api_url,
                config
                    .gitlab_api_url
                    .as_deref()
                    .or(file.gitlab.as_ref().and_then(|g| g.api_url.as_deref())),
            )),
            None => None,
        };
        let retrier = retry::Retrier::new(io, file.retry.clone());
        Ok(Self {
            shared,
            registry,
            listener,
            metadata_listener,
            reconciler,
            retrier,
        })
    }

    /// The HTTP listener's address.
    pub fn local_addr(&self) -> SocketAddr {
        #[allow(clippy::expect_used)]
        self.listener.local_addr().expect("bound listener")
    }

    /// The instance callback/metadata API's address (`None` without an
    /// instance token key: the API is not served then).
    pub fn metadata_addr(&self) -> Option<SocketAddr> {
        self.metadata_listener
            .as_ref()
            .and_then(|l| l.local_addr().ok())
    }

    /// Runs until `shutdown` resolves: operations under way finish, leases
    /// are released so another replica takes over at once.
    pub async fn run(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let stop = runyard_telemetry::cancel_on(shutdown);
        let (events_tx, events_rx) = mpsc::channel(8192);
        let (caught_up_tx, caught_up) = watch::channel(false);
        let caught_up_tx = Arc::new(caught_up_tx);
        let consumer = {
            let io = self.shared.io.clone();
            let stop = stop.clone();
            let caught_up_tx = caught_up_tx.clone();
            tokio::spawn(async move {
                follow(io, events_tx, caught_up_tx, stop).await;
            })
        };
        let claims = {
            let io = self.shared.io.clone();
            let stop = stop.clone();
            tokio::spawn(async move {
                loop {
                    if let Ok(n) = io.coord.claims_held().await {
                        io.metrics
                            .claims_held
                            .set(i64::try_from(n).unwrap_or(i64::MAX));
                    }
                    record_forge_calls(&io);
                    record_budgets(&io);
                    if let Some(gh) = &io.forges.github
                        && let Some(left) = gh.rate_limit_remaining()
                    {
                        io.metrics
                            .github_rate_limit_remaining
                            .set(i64::try_from(left).unwrap_or(i64::MAX));
                    }
                    tokio::select! {
                        () = stop.cancelled() => return,
                        () = tokio::time::sleep(Duration::from_secs(5)) => {}
                    }
                }
            })
        };
        let engine = {
            let engine = Engine::new(self.shared.clone());
            let stop = stop.clone();
            let caught_up = caught_up.clone();
            tokio::spawn(async move { engine.run(events_rx, caught_up, stop).await })
        };
        let reconciler = self.reconciler.map(|r| tokio::spawn(r.run(stop.clone())));
        let listeners: Vec<_> = self
            .shared
            .io
            .forges
            .scale_sets
            .values()
            .map(|set| {
                let pool = &self.shared.pools[&set.pool];
                let io = &self.shared.io;
                let twins = scaleset::resolve::Resolver::new(
                    io.forges.github_for(&pool.config.scope).ok().cloned(),
                    io.timers.forge_timeout.min(Duration::from_secs(2)),
                );
                let listener = scaleset::listener::Listener::new(
                    set.clone(),
                    twins,
                    io.bus.clone(),
                    io.metrics.clone(),
                    self.shared.owned.clone(),
                    scaleset::listener::Settings {
                        silence: io.timers.scale_set_silence,
                        backoff: io.timers.scale_set_backoff,
                        max_capacity: pool.config.max_runners,
                        instance: pool.spec.instance.clone(),
                        replica: io.coord.replica().to_owned(),
                    },
                );
                tokio::spawn(listener.run(stop.clone()))
            })
            .collect();
        let retrier_progress = self.retrier.progress();
        let retrier = tokio::spawn(self.retrier.run(stop.clone()));
        let http_state = HttpState {
            shared: self.shared.clone(),
            retrier: retrier_progress,
            registry: self.registry.clone(),
            caught_up,
        };
        let router = axum::Router::new()
            .route(
                "/healthz",
                get(|| async { axum::Json(json!({"status": "ok"})) }),
            )
            .route("/readyz", get(readyz))
            .route("/metrics", get(metrics_text))
            .route("/v1/pools", get(pools))
            .route("/v1/queue", get(queue))
            .with_state(http_state);
        let http = tokio::spawn(serve(self.listener, router, stop.clone()));
        let metadata_tasks = tokio_util::task::TaskTracker::new();
        let metadata_http = match (
            self.metadata_listener,
            metadata::api::router(
                self.shared.io.clone(),
                self.shared.pools.clone(),
                self.shared.metadata.clone(),
                metadata_tasks.clone(),
            ),
        ) {
            (Some(listener), Some(router)) => {
                Some(tokio::spawn(serve(listener, router, stop.clone())))
            }
            _ => None,
        };
        stop.cancelled().await;
        // Instances are untrusted clients: one holding its connection open
        // does not hold the shutdown up for long.
        if let Some(h) = metadata_http {
            let _ = tokio::time::timeout(Duration::from_secs(10), h).await;
        }
        // Failed instances being removed: a bounded wait, then the
        // bootstrap timeout reaps what is left.
        metadata_tasks.close();
        let _ = tokio::time::timeout(Duration::from_secs(10), metadata_tasks.wait()).await;
        let _ = engine.await;
        let _ = consumer.await;
        let _ = claims.await;
        if let Some(reconciler) = reconciler {
            let _ = reconciler.await;
        }
        let _ = retrier.await;
        for listener in listeners {
            let _ = listener.await;
        }
        let _ = http.await;
        let _ =
            tokio::time::timeout(Duration::from_secs(5), self.shared.io.bus.client().flush()).await;
        tracing::info!("scaler stopped");
        Ok(())
    }
}

/// Serves `router` on `listener` (plaintext or TLS) until `stop`.
async fn serve(
    listener: runyard_tls::Listener,
    router: axum::Router,
    stop: tokio_util::sync::CancellationToken,
) {
    runyard_tls::serve(listener, router, runyard_tls::HEAD_TIMEOUT, async move {
        stop.cancelled().await
    })
    .await;
}

async fn wait_for<T, E: std::fmt::Display, F: Future<Output = Result<T, E>>>(
    mut f: impl FnMut() -> F,
) -> Result<T, E> {
    let mut last = None;
    for _ in 0..50 {
        match f().await {
            Ok(v) => return Ok(v),
            Err(e) => {
                tracing::warn!(error = %e, "not ready yet; retrying");
                last = Some(e);
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    #[allow(clippy::expect_used)]
    Err(last.expect("at least one attempt"))
}

/// Hands the log's job and runner events to the engine; says when the
/// history that existed at start has been read (a delivery with nothing
/// matching left behind it).
#[derive(Debug)]
struct Forward {
    tx: mpsc::Sender<engine::Observed>,
    caught_up: Arc<watch::Sender<bool>>,
}

impl Handler for Forward {
    async fn handle(&self, batch: &[Delivery]) -> Result<Vec<(u64, String)>, HandlerError> {
        for d in batch {
            let observed = engine::Observed {
                seq: d.seq,
                event: d.event.clone(),
                traceparent: d.traceparent.clone(),
            };
            if self.tx.send(observed).await.is_err() {
                return Err(HandlerError::Transient("the engine stopped".into()));
            }
        }
        if batch.iter().any(|d| d.pending == 0) {
            self.caught_up
                .send_if_modified(|v| !std::mem::replace(v, true));
        }
        Ok(Vec::new())
    }
}

/// How many messages of the stream match `filters` from `start` on (asked
/// of a throwaway consumer), so a follower with nothing to read is caught
/// up at once.
async fn pending_from(
    bus: &Bus,
    filters: &[String],
    start: time::OffsetDateTime,
) -> Result<u64, async_nats::Error> {
    use async_nats::jetstream::consumer;
    let stream = bus
        .jetstream()
        .get_stream(bus.namespace().events_stream())
        .await?;
    let mut probe = stream
        .create_consumer(consumer::pull::Config {
            filter_subjects: filters.to_vec(),
            deliver_policy: consumer::DeliverPolicy::ByStartTime { start_time: start },
            ack_policy: consumer::AckPolicy::None,
            inactive_threshold: Duration::from_secs(5),
            ..Default::default()
        })
        .await?;
    let pending = probe.info().await?.num_pending;
    let name = probe.cached_info().name.clone();
    let _ = stream.delete_consumer(&name).await;
    Ok(pending)
}

async fn follow(
    io: Arc<io::Io>,
    tx: mpsc::Sender<engine::Observed>,
    caught_up: Arc<watch::Sender<bool>>,
    stop: tokio_util::sync::CancellationToken,
) {
    let bus = &io.bus;
    let ns = bus.namespace().clone();
    loop {
        if stop.is_cancelled() {
            return;
        }
        let ready = bus.is_connected()
            && bus
                .create_events_stream_if_missing(&StreamSettings::default())
                .await
                .is_ok();
        let start = time::OffsetDateTime::now_utc() - io.timers.lookback;
        let filters = vec![
            format!("{}.v1.job.>", ns.as_str()),
            format!("{}.v1.runner.>", ns.as_str()),
        ];
        let pending = if ready {
            pending_from(bus, &filters, start).await.ok()
        } else {
            None
        };
        let Some(pending) = pending else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        let config = ConsumerConfig {
            durable: None,
            description: "runyard scaler".into(),
            filter_subjects: filters,
            deliver: Deliver::ByStartTime(start),
            batch_size: 500,
            batch_wait: Duration::from_millis(2),
            span_name: "scaler observe",
            ..ConsumerConfig::default()
        };
        match Consumer::bind(bus, config, None).await {
            Ok(consumer) => {
                if pending == 0 {
                    caught_up.send_if_modified(|v| !std::mem::replace(v, true));
                }
                let handler = Forward {
                    tx: tx.clone(),
                    caught_up: caught_up.clone(),
                };
                consumer.run(handler, stop.clone()).await;
                return;
            }
            Err(error) => {
                tracing::warn!(%error, "cannot follow the log yet; retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
}

#[derive(Clone)]
struct HttpState {
    shared: Arc<Shared>,
    retrier: Arc<progress::Progress>,
    registry: Metrics,
    caught_up: watch::Receiver<bool>,
}

async fn readyz(AxumState(s): AxumState<HttpState>) -> Response {
    let nats = s.shared.io.bus.is_connected();
    let caught_up = *s.caught_up.borrow();
    let status = if nats && caught_up {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        status,
        axum::Json(json!({"nats_connected": nats, "caught_up": caught_up})),
    )
        .into_response()
}

/// Brings the GitHub budget gauges and the creates waiting for them up to
/// date (also at each scrape: a budget changes with every answer).
fn record_budgets(io: &io::Io) {
    for gh in io.forges.github.iter().chain(&io.forges.github_pat) {
        io.metrics.record_rate_budgets(&gh.rate_budgets());
    }
    io.metrics
        .creates_waiting_for_rate_limit
        .set(i64::try_from(io.forges.waiting.len()).unwrap_or(i64::MAX));
}

async fn metrics_text(AxumState(s): AxumState<HttpState>) -> Response {
    record_budgets(&s.shared.io);
    (
        [(
            header::CONTENT_TYPE,
            runyard_telemetry::METRICS_CONTENT_TYPE,
        )],
        s.registry.encode(),
    )
        .into_response()
}

/// `GET /v1/queue`: every queued or waiting job this replica's world
/// holds, oldest first, with why it has no runner yet.
async fn queue(AxumState(s): AxumState<HttpState>) -> Response {
    let (at, mut jobs) = s.shared.queue.read().map(|q| q.clone()).unwrap_or_default();
    rate_limited(&mut jobs, &s.shared.io.forges.waiting.spent(), at.as_secs());
    axum::Json(json!({ "as_of": at.as_secs_f64(), "jobs": jobs })).into_response()
}

/// A create under way while its forge's budget is spent waits for it:
/// those jobs say so, with when the budget returns.
fn rate_limited(jobs: &mut [core::queue::QueuedJob], spent: &[forges::Spent], now: u64) {
    for job in jobs.iter_mut().filter(|j| j.reason == "creating") {
        let Some(w) = spent.iter().find(|w| w.forge == job.forge) else {
            continue;
        };
        let back = w.until.map_or_else(
            || "until its budget returns".to_owned(),
            |u| {
                let when = i64::try_from(u)
                    .ok()
                    .and_then(|u| time::OffsetDateTime::from_unix_timestamp(u).ok())
                    .and_then(|t| {
                        t.format(&time::format_description::well_known::Rfc3339)
                            .ok()
                    })
                    .unwrap_or_default();
                format!("until {when} (in {}s)", u.saturating_sub(now))
            },
        );
        job.reason = "rate_limited";
        job.detail = format!(
            "the create of runner {} waits out {}'s rate limit on {} {back}; {} creates in line",
            job.runner.as_deref().unwrap_or("-"),
            w.forge,
            w.endpoint,
            w.waiting
        );
    }
}

async fn pools(AxumState(s): AxumState<HttpState>) -> Response {
    let pools = s
        .shared
        .status
        .read()
        .map(|p| p.clone())
        .unwrap_or_default();
    let mut pools = serde_json::to_value(pools).unwrap_or_default();
    if let Some(list) = pools.as_array_mut() {
        for pool in list {
            let set = pool["name"]
                .as_str()
                .and_then(|n| s.shared.io.forges.scale_sets.get(n));
            if let Some(set) = set {
                pool["scale_set"] = serde_json::to_value(set.view()).unwrap_or_default();
            }
        }
    }
    let engine = s.shared.progress.view();
    let retrier = s.retrier.view();
    axum::Json(json!({ "pools": pools, "engine": engine, "retrier": retrier })).into_response()
}
