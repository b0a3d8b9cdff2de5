//! runyard console: read-only web pages that answer what a CI platform
//! team is asked — why a job is still waiting (the queue), what the pools
//! are doing (runners, provider errors, queue waits), why a job got its
//! memory and what happened to it (a job's story), what a workload uses
//! and what it gets now (a workload's chart), and what runyard saved
//! (savings).
//!
//! It reads the projection through a read-only Postgres role, the
//! scaler's `/v1/queue` and `/v1/pools`, and the allocator's
//! recommendations as previews; it writes nothing. No page answers without
//! credentials ([`auth`]).

pub mod auth;
pub mod chart;
pub mod config;
mod kept;
mod metrics;
pub mod pages;
pub mod upstream;
pub mod view;

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use axum::extract::{Form, MatchedPath, Path, Query, Request, State as AxumState};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use runyard_insight::savings::SavingsQuery;
use runyard_telemetry::Metrics;
use serde::Deserialize;
use serde_json::json;
use sqlx::PgPool;
use tokio::net::TcpListener;

pub use config::Config;
use metrics::{ConsoleMetrics, PageLabel, PageLabels, ReasonLabel};
use pages::search::Answer;

/// What every handler shares.
#[derive(Debug)]
pub struct Inner {
    db: PgPool,
    scaler: upstream::Scaler,
    allocator: upstream::Allocator,
    auth: auth::Auth,
    before_memory: Option<u64>,
    before_memory_projects: std::collections::BTreeMap<String, u64>,
    target_oom: f64,
    savings_window: Duration,
    registry: Metrics,
    metrics: ConsoleMetrics,
    /// When the savings series were last computed.
    savings_at: tokio::sync::Mutex<Option<Instant>>,
    /// The savings of windows slow to sum up ([`kept`]).
    kept: kept::Kept,
    /// Sign-in attempts per address ([`LOGINS_PER_MINUTE`]).
    logins: governor::DefaultKeyedRateLimiter<IpAddr>,
    db_ok: AtomicBool,
}

impl Inner {
    /// Counts a refused request.
    fn refused(&self, refusal: auth::Refusal) {
        self.metrics
            .refused
            .get_or_create(&ReasonLabel {
                reason: refusal.reason().into(),
            })
            .inc();
    }

    /// The savings over `window`, with the configured baselines.
    fn savings_query(&self, window: Duration) -> SavingsQuery {
        SavingsQuery {
            window,
            before_memory: self.before_memory,
            before_memory_by_project: self.before_memory_projects.clone(),
            target_oom: self.target_oom,
        }
    }
}

type State = Arc<Inner>;

/// The console, bound and connected, ready to [`App::run`].
#[derive(Debug)]
pub struct App {
    state: State,
    listener: runyard_tls::Listener,
}

/// Sign-in attempts an address may make per minute (a token is 256 bits:
/// this bounds the work a guesser makes, not its odds).
const LOGINS_PER_MINUTE: std::num::NonZeroU32 = std::num::NonZeroU32::new(20).unwrap();

/// How long a page's queries may take in all before Postgres stops them.
const STATEMENT_TIMEOUT: &str = "10s";

/// Memory a sort or hash of a page's query may use before it spills to
/// disk: the savings' queue-wait percentiles sort a month of jobs.
const WORK_MEM: &str = "32MB";

impl App {
    /// Checks the settings and secrets, binds the listener, connects to
    /// the projection (waiting for Postgres) and refuses a database role
    /// that could write.
    pub async fn build(config: Config) -> anyhow::Result<Self> {
        config.validate()?;
        config.check_secrets()?;
        let tls = runyard_tls::ServerTls::http_acceptor(
            "CONSOLE",
            config.tls.cert.as_deref(),
            config.tls.key.as_deref(),
            config.tls.client_ca.as_deref(),
        )?;
        let secure = config
            .console_cookie_secure
            .unwrap_or(config.tls.cert.is_some());
        let listener = std::net::TcpListener::bind(config.console_listen)
            .with_context(|| format!("binding {}", config.console_listen))?;
        listener.set_nonblocking(true)?;
        let listener = runyard_tls::Listener::new(TcpListener::from_std(listener)?, tls);
        let db = connect(&config).await?;
        read_only(&db).await?;
        let http = reqwest::Client::builder()
            .timeout(upstream::TIMEOUT)
            .build()
            .context("making the scaler's HTTP client")?;
        let allocator = allocator_client(&config)?;
        let registry = Metrics::new();
        let metrics = ConsoleMetrics::register(&registry);
        let auth = auth::Auth::new(
            config.console_tokens.clone(),
            config.trusted_proxies()?,
            http::HeaderName::from_bytes(config.console_identity_header.as_bytes())
                .context("RUNYARD_CONSOLE_IDENTITY_HEADER")?,
            config.console_session_ttl,
            secure,
        );
        tracing::info!(
            addr = %listener.local_addr()?,
            tokens = config.console_tokens.len(),
            trusted_proxies = config.trusted_proxies()?.len(),
            "console listening"
        );
        Ok(Self {
            state: Arc::new(Inner {
                db,
                scaler: upstream::Scaler::new(http, &config.scaler_url),
                allocator,
                auth,
                before_memory: config.console_before_memory.map(|b| b.as_u64()),
                before_memory_projects: config.before_memory_projects()?,
                target_oom: config.allocator_target_oom,
                savings_window: config.console_savings_window,
                registry,
                metrics,
                savings_at: tokio::sync::Mutex::new(None),
                kept: kept::Kept::default(),
                logins: governor::RateLimiter::keyed(governor::Quota::per_minute(
                    LOGINS_PER_MINUTE,
                )),
                db_ok: AtomicBool::new(true),
            }),
            listener,
        })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        #[allow(clippy::expect_used)]
        self.listener.local_addr().expect("bound listener")
    }

    /// Serves until `shutdown` resolves.
    pub async fn run(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let router = router(self.state.clone());
        // The savings page's default window, summed up before anyone asks
        // (kept when that is slow: a busy site's month).
        let warm = self.state.clone();
        tokio::spawn(async move {
            if let Err(error) = kept::compute(&warm, pages::savings::DEFAULT_WINDOW).await {
                tracing::warn!(%error, "the savings page's default window not summed up");
            }
        });
        runyard_tls::serve(self.listener, router, runyard_tls::HEAD_TIMEOUT, shutdown).await;
        self.state.db.close().await;
        tracing::info!("console stopped");
        Ok(())
    }
}

/// How the console's sessions of the projection at `url` are set up: read
/// only, every statement bounded, sorts in memory, no JIT (the pages'
/// benchmark reads through the same).
pub fn session(url: &str) -> anyhow::Result<sqlx::postgres::PgConnectOptions> {
    use std::str::FromStr as _;
    Ok(sqlx::postgres::PgConnectOptions::from_str(url)
        .context("RUNYARD_DATABASE_URL")?
        .application_name("runyard-console")
        .options([
            ("default_transaction_read_only", "on"),
            ("statement_timeout", STATEMENT_TIMEOUT),
            ("work_mem", WORK_MEM),
            // Compiling a query costs more than it saves on the pages'
            // reads (about 300 ms of a month's savings).
            ("jit", "off"),
        ]))
}

/// The read-only pool: every session read-only, every statement bounded.
async fn connect(config: &Config) -> anyhow::Result<PgPool> {
    let options = session(&config.database.url)?;
    let shown = runyard_config::redact::url(&config.database.url);
    let mut wait = Duration::from_millis(100);
    loop {
        match sqlx::postgres::PgPoolOptions::new()
            .max_connections(config.database_pool_size.max(1))
            .acquire_timeout(Duration::from_secs(5))
            .connect_with(options.clone())
            .await
        {
            Ok(pool) => return Ok(pool),
            Err(e) if transient(&e) => {
                tracing::warn!(database = %shown, error = %e, retry_in = ?wait, "postgres not reachable; waiting");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(5));
            }
            Err(e) => return Err(anyhow::anyhow!("connecting to {shown}: {e}")),
        }
    }
}

fn transient(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(io) => io.kind() != std::io::ErrorKind::InvalidData,
        sqlx::Error::PoolTimedOut => true,
        sqlx::Error::Database(d) => d
            .code()
            .is_some_and(|c| c.starts_with("57P") || c.starts_with("08")),
        _ => false,
    }
}

/// Refuses a role that could write the projection: a superuser, or one
/// that may insert, update, delete or truncate any of its tables.
async fn read_only(db: &PgPool) -> anyhow::Result<()> {
    let (role, superuser): (String, bool) = sqlx::query_as(
        "SELECT current_user::text, rolsuper FROM pg_roles WHERE rolname = current_user",
    )
    .fetch_one(db)
    .await
    .context("reading the console's database role")?;
    if superuser {
        anyhow::bail!(
            "RUNYARD_DATABASE_URL logs in as {role}, a superuser: the console reads through a read-only role (CREATE ROLE runyard_console LOGIN IN ROLE runyard_reader; docs/console.md)"
        );
    }
    let writable: Option<String> = sqlx::query_scalar(
        "SELECT string_agg(c.relname, ', ' ORDER BY c.relname)
           FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
          WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p')
            AND (has_table_privilege(c.oid, 'INSERT') OR has_table_privilege(c.oid, 'UPDATE')
                 OR has_table_privilege(c.oid, 'DELETE') OR has_table_privilege(c.oid, 'TRUNCATE'))",
    )
    .fetch_one(db)
    .await
    .context("reading the console's table privileges")?;
    if let Some(tables) = writable {
        anyhow::bail!(
            "RUNYARD_DATABASE_URL logs in as {role}, which may write {tables}: the console reads through a read-only role (a member of runyard_reader; docs/console.md)"
        );
    }
    Ok(())
}

fn allocator_client(config: &Config) -> anyhow::Result<upstream::Allocator> {
    if config.allocator_url.trim().is_empty() {
        return Ok(upstream::Allocator::new(None));
    }
    let files = runyard_tls::ClientFiles::new(
        config.allocator_ca_file.as_deref(),
        config.allocator_client_cert.as_deref(),
        config.allocator_client_key.as_deref(),
    )?;
    let mut endpoint = tonic::transport::Endpoint::from_shared(config.allocator_url.clone())
        .with_context(|| {
            format!(
                "RUNYARD_ALLOCATOR_URL {} is not a URL",
                runyard_config::redact::url(&config.allocator_url)
            )
        })?;
    if config.allocator_url.starts_with("https://") {
        endpoint = endpoint.tls_config(files.grpc()?)?;
    }
    Ok(upstream::Allocator::new(Some(
        runyard_allocator_api::client::Client::new(
            endpoint,
            config.allocator_client_token.clone(),
            upstream::TIMEOUT,
        ),
    )))
}

fn router(state: State) -> axum::Router {
    let pages = axum::Router::new()
        .route("/", get(|| async { Redirect::to("/queue") }))
        .route("/queue", get(queue))
        .route("/pools", get(pools))
        .route("/jobs/{forge}/{instance}/{job_id}", get(job))
        .route("/runners/{name}", get(runner))
        .route("/workloads", get(workload))
        .route("/savings", get(savings))
        .route("/search", get(search))
        .route("/logout", post(logout))
        .route_layer(middleware::from_fn_with_state(state.clone(), signed_in));
    axum::Router::new()
        .merge(pages)
        .route("/login", get(login_form).post(login))
        .route("/static/console.css", get(css))
        .route(
            "/healthz",
            get(|| async { axum::Json(json!({"status": "ok"})) }),
        )
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_text))
        .layer(middleware::from_fn_with_state(state.clone(), measured))
        .layer(axum::extract::DefaultBodyLimit::max(8 * 1024))
        .with_state(state)
}

/// The page a path is, for the metrics.
fn page_of(path: &str) -> &'static str {
    match path {
        "/queue" => "queue",
        "/pools" => "pools",
        "/jobs/{forge}/{instance}/{job_id}" => "job",
        "/runners/{name}" => "runner",
        "/workloads" => "workload",
        "/savings" => "savings",
        "/search" => "search",
        "/login" | "/logout" => "login",
        "/static/console.css" => "static",
        "/metrics" | "/healthz" | "/readyz" => "ops",
        "/" => "root",
        _ => "other",
    }
}

/// Counts and times every answer, and sets the headers every page has: no
/// framing, no sniffing, no scripts or outside resources, no caching of
/// what a person saw.
async fn measured(AxumState(s): AxumState<State>, request: Request, next: Next) -> Response {
    let page = page_of(
        request
            .extensions()
            .get::<MatchedPath>()
            .map_or("", MatchedPath::as_str),
    );
    let started = Instant::now();
    let mut response = next.run(request).await;
    if page != "ops" {
        s.metrics
            .page_seconds
            .get_or_create(&PageLabel { page: page.into() })
            .observe(started.elapsed().as_secs_f64());
    }
    s.metrics
        .requests
        .get_or_create(&PageLabels {
            page: page.into(),
            status: response.status().as_u16(),
        })
        .inc();
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    if page != "static" && !h.contains_key(header::CACHE_CONTROL) {
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    response
}

/// The address the connection came from (`runyard_tls::serve` gives
/// every request its `ConnectInfo<Peer>`).
fn peer(request: &Request) -> Option<IpAddr> {
    request
        .extensions()
        .get::<axum::extract::ConnectInfo<runyard_tls::Peer>>()
        .map(|p| p.0.addr.ip())
}

fn now() -> i64 {
    time::OffsetDateTime::now_utc().unix_timestamp()
}

/// Lets a request through only with credentials ([`auth`]); else 401
/// with the login page (a browser) or the reason (anything else).
async fn signed_in(AxumState(s): AxumState<State>, mut request: Request, next: Next) -> Response {
    match s.auth.identify(request.headers(), peer(&request), now()) {
        Ok(viewer) => {
            request.extensions_mut().insert(viewer);
            next.run(request).await
        }
        Err(refusal) => {
            s.refused(refusal);
            let next_path = request
                .uri()
                .path_and_query()
                .map_or("/queue", |p| p.as_str())
                .to_owned();
            let mut response = (
                StatusCode::UNAUTHORIZED,
                pages::login::form(
                    refusal.message(),
                    &pages::login::safe_next(Some(&next_path)),
                    s.auth.takes_tokens(),
                ),
            )
                .into_response();
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"runyard-console\""),
            );
            if refusal == auth::Refusal::BadSession
                && let Ok(v) = HeaderValue::from_str(&s.auth.logout())
            {
                response.headers_mut().insert(header::SET_COOKIE, v);
            }
            response
        }
    }
}

type Viewer = axum::Extension<auth::Viewer>;

async fn queue(AxumState(s): AxumState<State>, viewer: Viewer) -> Response {
    pages::render(&viewer, pages::queue::page(&s).await)
}

async fn pools(AxumState(s): AxumState<State>, viewer: Viewer) -> Response {
    pages::render(&viewer, pages::pools::page(&s).await)
}

async fn job(
    AxumState(s): AxumState<State>,
    viewer: Viewer,
    Path((forge, instance, job_id)): Path<(String, String, String)>,
) -> Response {
    pages::render(
        &viewer,
        pages::job::page(&s, &forge, &instance, &job_id).await,
    )
}

/// `GET /runners/{name}`: to its job's story, else to search.
async fn runner(
    AxumState(s): AxumState<State>,
    viewer: Viewer,
    Path(name): Path<String>,
) -> Response {
    match runyard_insight::pools::runner(&s.db, &name).await {
        Ok(Some(r)) => match r.job {
            Some(j) => {
                Redirect::to(&view::job_href(&j.forge, &j.instance, j.job_id)).into_response()
            }
            None => Redirect::to(&format!("/search?q={}", view::encode(&name))).into_response(),
        },
        Ok(None) => pages::render(
            &viewer,
            Err(pages::PageError::NotFound(format!(
                "runyard made no runner named {name:?}"
            ))),
        ),
        Err(e) => pages::render(&viewer, Err(e.into())),
    }
}

/// The query of every page that takes one; each reads what it needs and
/// names a bad value itself.
#[derive(Debug, Deserialize, Default)]
struct Params {
    key: Option<String>,
    n: Option<String>,
    since: Option<String>,
    q: Option<String>,
    next: Option<String>,
}

fn params(q: Result<Query<Params>, axum::extract::rejection::QueryRejection>) -> Params {
    q.map(|Query(p)| p).unwrap_or_default()
}

async fn workload(
    AxumState(s): AxumState<State>,
    viewer: Viewer,
    q: Result<Query<Params>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let p = params(q);
    pages::render(
        &viewer,
        pages::workload::page(&s, p.key.as_deref(), p.n.as_deref()).await,
    )
}

async fn savings(
    AxumState(s): AxumState<State>,
    viewer: Viewer,
    q: Result<Query<Params>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let p = params(q);
    pages::render(&viewer, pages::savings::page(&s, p.since.as_deref()).await)
}

async fn search(
    AxumState(s): AxumState<State>,
    viewer: Viewer,
    q: Result<Query<Params>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let p = params(q);
    match pages::search::page(&s, p.q.as_deref()).await {
        Ok(Answer::Go(href)) => Answer::redirect(&href),
        Ok(Answer::Page(page)) => pages::render(&viewer, Ok(page)),
        Err(e) => pages::render(&viewer, Err(e)),
    }
}

async fn login_form(
    AxumState(s): AxumState<State>,
    q: Result<Query<Params>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let p = params(q);
    pages::login::form(
        "Sign in with a console token.",
        &pages::login::safe_next(p.next.as_deref()),
        s.auth.takes_tokens(),
    )
    .into_response()
}

#[derive(Debug, Deserialize)]
struct LoginForm {
    token: String,
    next: Option<String>,
}

async fn login(AxumState(s): AxumState<State>, request: Request) -> Response {
    use axum::extract::FromRequest as _;
    let from = peer(&request).map(runyard_tls::peer_key);
    let form = Form::<LoginForm>::from_request(request, &()).await;
    if let Some(ip) = from {
        s.logins.retain_recent();
        if s.logins.check_key(&ip).is_err() {
            let mut r = (
                StatusCode::TOO_MANY_REQUESTS,
                pages::login::form(
                    "too many sign-in attempts from your address: wait a minute",
                    "/queue",
                    s.auth.takes_tokens(),
                ),
            )
                .into_response();
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("60"));
            return r;
        }
    }
    let next = form
        .as_ref()
        .ok()
        .and_then(|Form(f)| f.next.as_deref())
        .map_or_else(|| "/queue".to_owned(), |n| pages::login::safe_next(Some(n)));
    let Ok(Form(form)) = form else {
        return (
            StatusCode::BAD_REQUEST,
            pages::login::form("The form needs a token.", &next, s.auth.takes_tokens()),
        )
            .into_response();
    };
    match s.auth.login(&form.token, now()) {
        Ok(cookie) => {
            let mut r = Redirect::to(&next).into_response();
            if let Ok(v) = HeaderValue::from_str(&cookie) {
                r.headers_mut().insert(header::SET_COOKIE, v);
            }
            r
        }
        Err(refusal) => {
            s.refused(refusal);
            (
                StatusCode::UNAUTHORIZED,
                pages::login::form(refusal.message(), &next, s.auth.takes_tokens()),
            )
                .into_response()
        }
    }
}

async fn logout(AxumState(s): AxumState<State>) -> Response {
    let mut r = Redirect::to("/login").into_response();
    if let Ok(v) = HeaderValue::from_str(&s.auth.logout()) {
        r.headers_mut().insert(header::SET_COOKIE, v);
    }
    r
}

async fn css() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/css; charset=utf-8"),
            (header::CACHE_CONTROL, "public, max-age=3600"),
        ],
        view::CSS,
    )
        .into_response()
}

async fn readyz(AxumState(s): AxumState<State>) -> Response {
    let ok = sqlx::query("SELECT 1 FROM jobs LIMIT 1")
        .fetch_optional(&s.db)
        .await
        .is_ok();
    s.db_ok.store(ok, Ordering::Relaxed);
    let status = if ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, axum::Json(json!({"projection_readable": ok}))).into_response()
}

/// How often the savings series are computed again at most.
const SAVINGS_EVERY: Duration = Duration::from_secs(60);

async fn metrics_text(AxumState(s): AxumState<State>) -> Response {
    {
        let mut at = s.savings_at.lock().await;
        if at.is_none_or(|t| t.elapsed() >= SAVINGS_EVERY) {
            // The page's figures: kept ones on a site where the window is
            // slow to sum up ([`kept`]).
            match tokio::time::timeout(Duration::from_secs(10), kept::savings(&s, s.savings_window))
                .await
            {
                Ok(Ok(answer)) => {
                    s.metrics
                        .savings
                        .set(&answer.savings, &window_name(s.savings_window));
                    *at = Some(Instant::now());
                }
                Ok(Err(error)) => tracing::warn!(%error, "savings series not computed"),
                Err(_) => tracing::warn!("savings series took over 10 s; not computed"),
            }
        }
    }
    (
        [(
            header::CONTENT_TYPE,
            runyard_telemetry::METRICS_CONTENT_TYPE,
        )],
        s.registry.encode(),
    )
        .into_response()
}

/// `30d`, `12h`, `90s`: the window label of the savings series.
fn window_name(d: Duration) -> String {
    let s = d.as_secs();
    if s.is_multiple_of(86_400) {
        format!("{}d", s / 86_400)
    } else if s.is_multiple_of(3600) {
        format!("{}h", s / 3600)
    } else {
        format!("{s}s")
    }
}
