//! runyard's Postgres projection of the event log: the sea-orm entities the
//! allocator, the scaler and people read, the migrations job-tracker runs, and
//! the workload key that groups usage samples of the same workload.

pub mod entities;
pub mod migration;
pub mod workload;

use sea_orm_migration::MigratorTrait as _;

pub use migration::Migrator;

/// Errors of store housekeeping.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database URL has no database name.
    #[error("database url {0:?} names no database")]
    NoDatabase(String),
    /// Postgres said no.
    #[error(transparent)]
    Db(#[from] sqlx::Error),
    /// A migration failed.
    #[error("migrating: {0}")]
    Migrate(#[from] sea_orm::DbErr),
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
            // Another replica created it in the meantime.
            Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("42P04") => {}
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

/// Creates the database if needed and brings its schema up to date.
pub async fn migrate(url: &str) -> Result<(), StoreError> {
    create_database_if_missing(url).await?;
    let db = sea_orm::Database::connect(url).await?;
    Migrator::up(&db, None).await?;
    db.close().await?;
    Ok(())
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
