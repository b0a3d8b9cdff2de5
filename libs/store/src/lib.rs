//! runyard's Postgres projection of the event log: the sea-orm entities the
//! allocator, the scaler and people read, the migrations job-tracker runs, and
//! the workload key that groups usage samples of the same workload.

pub mod entities;
pub mod migration;
pub mod workload;

use sea_orm_migration::MigratorTrait as _;

pub use migration::Migrator;

use std::time::Duration;

/// Errors of store housekeeping.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database URL has no database name.
    #[error("database url {} names no database", runyard_config::redact::url(.0))]
    NoDatabase(String),
    /// Postgres said no.
    #[error(transparent)]
    Db(#[from] sqlx::Error),
    /// A migration failed.
    #[error("migrating: {0}")]
    Migrate(#[from] sea_orm::DbErr),
}

impl StoreError {
    /// True when the error says Postgres could not be reached (yet): down,
    /// starting up, refusing connections, or a connection lost midway. Such
    /// an error is worth retrying; any other (bad SQL, wrong password, a
    /// missing database server name, a certificate not trusted) is not.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::NoDatabase(_) => false,
            Self::Db(e) => transient_sqlx(e),
            Self::Migrate(e) => transient_db_err(e),
        }
    }
}

fn transient_sqlx(e: &sqlx::Error) -> bool {
    match e {
        // Invalid data is what the TLS layer says of a certificate it does
        // not trust (or a peer that is not Postgres): waiting will not fix
        // it. Refused, reset, timed out and the like will.
        sqlx::Error::Io(io) => io.kind() != std::io::ErrorKind::InvalidData,
        sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::WorkerCrashed => true,
        // 57P01-57P03: admin shutdown, crash shutdown, cannot connect now
        // (starting up / recovering); class 08: connection exceptions.
        sqlx::Error::Database(d) => d
            .code()
            .is_some_and(|c| c.starts_with("57P") || c.starts_with("08")),
        _ => false,
    }
}

fn transient_db_err(e: &sea_orm::DbErr) -> bool {
    use sea_orm::{DbErr, RuntimeErr};
    match e {
        DbErr::ConnectionAcquire(_) | DbErr::Conn(RuntimeErr::SqlxError(_)) => match e {
            DbErr::Conn(RuntimeErr::SqlxError(inner)) => transient_sqlx(inner),
            _ => true,
        },
        DbErr::Exec(RuntimeErr::SqlxError(inner)) | DbErr::Query(RuntimeErr::SqlxError(inner)) => {
            transient_sqlx(inner)
        }
        _ => false,
    }
}

/// Splits `postgres://.../name?opts` into server part, database name and
/// query string.
fn url_parts(url: &str) -> Result<(&str, &str, Option<&str>), StoreError> {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let (server, name) = base
        .rsplit_once('/')
        .filter(|(s, n)| !n.is_empty() && s.contains("://") && !s.ends_with('/'))
        .ok_or_else(|| StoreError::NoDatabase(url.to_owned()))?;
    Ok((server, name, query))
}

/// The same URL pointing at another database on the same server.
pub fn with_database(url: &str, name: &str) -> Result<String, StoreError> {
    let (server, _, query) = url_parts(url)?;
    Ok(match query {
        Some(q) => format!("{server}/{name}?{q}"),
        None => format!("{server}/{name}"),
    })
}

/// Splits a database URL into the server's admin URL (database `postgres`)
/// and the database name.
pub fn split_database_url(url: &str) -> Result<(String, String), StoreError> {
    let (_, name, _) = url_parts(url)?;
    Ok((with_database(url, "postgres")?, name.to_owned()))
}

/// Creates the database named in `url` if it does not exist yet.
pub async fn create_database_if_missing(url: &str) -> Result<(), StoreError> {
    let (admin, name) = split_database_url(url)?;
    let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(&admin).await?;
    let exists: Option<i32> = sqlx::query_scalar("SELECT 1 FROM pg_database WHERE datname = $1")
        .bind(&name)
        .fetch_optional(&mut conn)
        .await?;
    if exists.is_none() {
        let sql = format!("CREATE DATABASE \"{}\"", name.replace('"', "\"\""));
        match sqlx::query(&sql).execute(&mut conn).await {
            Ok(_) => tracing::info!(database = %name, "created database"),
            // Another replica created it in the meantime: 42P04 when it was
            // there by the time we asked, 23505 (on
            // `pg_database_datname_index`) when both asked at once.
            Err(sqlx::Error::Database(e))
                if matches!(e.code().as_deref(), Some("42P04" | "23505")) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Drops a database (terminating its connections first).
pub async fn drop_database(url: &str) -> Result<(), StoreError> {
    let (admin, name) = split_database_url(url)?;
    let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(&admin).await?;
    let sql = format!(
        "DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)",
        name.replace('"', "\"\"")
    );
    sqlx::query(&sql).execute(&mut conn).await?;
    Ok(())
}

/// The key of the session-level advisory lock migrations run under
/// (`pg_advisory_lock`), the same in every process of every version.
pub const MIGRATION_LOCK: i64 = 0x7275_6e79_6172_6400; // "runyard\0"

/// Creates the database if needed and brings its schema up to date.
///
/// Migrations run under a Postgres advisory lock ([`MIGRATION_LOCK`]) on
/// the one connection that runs them, so replicas started at the same
/// instant on a fresh database take turns: the first migrates, the others
/// find nothing left to do. The lock goes with the session if the process
/// dies. Then [`READER_ROLE`], when it exists, may read every table.
pub async fn migrate(url: &str) -> Result<(), StoreError> {
    use sea_orm::ConnectionTrait as _;
    create_database_if_missing(url).await?;
    let mut options = sea_orm::ConnectOptions::new(url.to_owned());
    options
        .max_connections(1)
        .min_connections(1)
        .connect_timeout(Duration::from_secs(5))
        .sqlx_logging(false);
    let db = sea_orm::Database::connect(options).await?;
    db.execute_unprepared(&format!("SELECT pg_advisory_lock({MIGRATION_LOCK})"))
        .await?;
    let migrated = match Migrator::up(&db, None).await {
        Ok(()) => db.execute_unprepared(GRANT_READERS).await.map(drop),
        Err(e) => Err(e),
    };
    let unlocked = db
        .execute_unprepared(&format!("SELECT pg_advisory_unlock({MIGRATION_LOCK})"))
        .await;
    migrated?;
    unlocked?;
    db.close().await?;
    Ok(())
}

/// The group role whose members read the projection and nothing else
/// (the console's login role is one): [`migrate`] grants it `SELECT` on
/// every table, each time it runs, so tables a later migration adds and a
/// rebuilt database are readable too. Made once by an operator:
/// `CREATE ROLE runyard_reader NOLOGIN` (docs/operations.md).
pub const READER_ROLE: &str = "runyard_reader";

/// `SELECT` on every table of the projection for [`READER_ROLE`], when
/// the role exists (nothing otherwise).
const GRANT_READERS: &str = "DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'runyard_reader') THEN
        GRANT SELECT ON ALL TABLES IN SCHEMA public TO runyard_reader;
    END IF;
END $$";

/// [`migrate`], waiting for Postgres: while it cannot be reached (down,
/// starting up), retries with exponential back-off and jitter (100 ms up to
/// 5 s), logging each failure with the URL's password redacted. Errors that
/// are not about reaching Postgres are returned at once.
pub async fn migrate_when_reachable(url: &str) -> Result<(), StoreError> {
    use backon::Retryable as _;
    let backoff = backon::ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(100))
        .with_max_delay(Duration::from_secs(5))
        .with_jitter()
        .without_max_times();
    (|| migrate(url))
        .retry(backoff)
        .when(StoreError::is_transient)
        .notify(|error, wait| {
            tracing::warn!(
                database = %runyard_config::redact::url(url),
                %error,
                retry_in = ?wait,
                "postgres not reachable; waiting"
            );
        })
        .await
}

/// A canonical text dump of the projection — every row of every table,
/// ordered by natural key, without surrogate ids or bookkeeping times — so
/// two projections (live and rebuilt, one replica and two) can be compared.
pub async fn canonical_dump(pool: &sqlx::PgPool) -> Result<String, sqlx::Error> {
    const QUERIES: &[(&str, &str)] = &[
        (
            "jobs",
            "SELECT (to_jsonb(t) - 'id')::text FROM jobs t ORDER BY forge, instance, job_id",
        ),
        (
            "pipelines",
            "SELECT (to_jsonb(t) - 'id')::text FROM pipelines t ORDER BY forge, instance, pipeline_id",
        ),
        (
            "usage_samples",
            "SELECT (to_jsonb(t) - 'id')::text FROM usage_samples t
             ORDER BY forge, instance, job_id, attempt",
        ),
        (
            "runners",
            "SELECT (to_jsonb(t) - 'id')::text FROM runners t ORDER BY name COLLATE \"C\"",
        ),
        (
            "retries",
            "SELECT to_jsonb(t)::text FROM retries t ORDER BY event_id COLLATE \"C\"",
        ),
        (
            "job_events",
            // The sequence and the trace are those of the copy of an
            // event this projection met first (a redelivered or
            // republished event has several), which two replicas may not
            // agree on.
            "SELECT (to_jsonb(t) - 'id' - 'stream_seq' - 'trace_id')::text FROM job_events t
             ORDER BY event_id COLLATE \"C\", job_id NULLS FIRST",
        ),
        (
            "applied_events",
            "SELECT event_id FROM applied_events ORDER BY event_id COLLATE \"C\"",
        ),
    ];
    let mut out = String::new();
    for (table, sql) in QUERIES {
        let rows: Vec<String> = sqlx::query_scalar(sql).fetch_all(pool).await?;
        out.push_str(&format!("-- {table} ({} rows)\n", rows.len()));
        for r in rows {
            out.push_str(&r);
            out.push('\n');
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_database_error_shows_no_password() {
        let e = StoreError::NoDatabase("postgres://u:s3cret@h/".into());
        assert!(!e.to_string().contains("s3cret"), "{e}");
    }

    #[test]
    fn database_urls_split_into_server_and_name() {
        let (admin, name) =
            split_database_url("postgres://postgres@127.0.0.1:5432/runyard").unwrap();
        assert_eq!(admin, "postgres://postgres@127.0.0.1:5432/postgres");
        assert_eq!(name, "runyard");
        let (admin, name) = split_database_url("postgres://u@h/db?sslmode=disable").unwrap();
        assert_eq!(
            (admin.as_str(), name.as_str()),
            ("postgres://u@h/postgres?sslmode=disable", "db")
        );
        assert!(split_database_url("postgres://u@h/").is_err());
        assert_eq!(
            with_database("postgres://u@h:1/db", "other").unwrap(),
            "postgres://u@h:1/other"
        );
        assert_eq!(
            with_database("postgres://postgres@h/runyard?x=1", "rb").unwrap(),
            "postgres://postgres@h/rb?x=1"
        );
    }
}
