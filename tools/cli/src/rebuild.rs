//! `runyard rebuild`: rebuilds the projection from the event log with the
//! code `runyard-job-tracker rebuild` runs too (`runyard_projection::rebuild`):
//! a fresh `<live>_rebuild` database, optionally swapped in for the live one.

use std::time::{Duration, Instant};

use clap::Args;
use runyard_projection::rebuild::{RebuildOptions, rebuild};
use serde_json::json;

use crate::{EXIT_OK, Failure, Global, out, out_json, progress, redact, table};

/// `runyard rebuild`.
#[derive(Args, Debug, Clone)]
pub struct RebuildArgs {
    /// Database to build (default `<live>_rebuild`); dropped first.
    #[arg(long)]
    pub into: Option<String>,
    /// Swap the rebuilt database in for the live one when done (the old one
    /// is kept as `<live>_old_<unix time>`).
    #[arg(long)]
    pub swap: bool,
    /// Events per transaction.
    #[arg(long, default_value_t = 5000)]
    pub batch_size: usize,
}

/// Runs `runyard rebuild`.
pub async fn run(global: &Global, args: &RebuildArgs) -> Result<u8, Failure> {
    let ns = global.ns()?;
    if args.batch_size == 0 {
        return Err(Failure::Usage("--batch-size must be at least 1".into()));
    }
    let (_, live) = runyard_store::split_database_url(&global.database_url).map_err(|e| {
        Failure::Usage(format!(
            "--database-url {}: {e}",
            redact(&global.database_url)
        ))
    })?;
    let target = args
        .into
        .clone()
        .unwrap_or_else(|| format!("{live}_rebuild"));
    if target == live {
        return Err(Failure::Usage(format!(
            "--into {target:?} is the live database: give another name"
        )));
    }
    let target_url = runyard_store::with_database(&global.database_url, &target)
        .map_err(|e| Failure::Usage(e.to_string()))?;
    let bus = runyard_bus::Bus::connect(&global.nats_url, ns.clone(), "runyard-cli-rebuild", false)
        .await
        .map_err(|e| {
            Failure::Failed(format!("{e}").replace(&global.nats_url, &redact(&global.nats_url)))
        })?;
    let mut stream = bus
        .jetstream()
        .get_stream(ns.events_stream())
        .await
        .map_err(|e| Failure::Failed(format!("stream {}: {e}", ns.events_stream())))?;
    let total = stream
        .info()
        .await
        .map_err(|e| Failure::Failed(format!("stream {}: {e}", ns.events_stream())))?
        .state
        .last_sequence;
    let bar = progress(total, global.json, "rebuild");
    bar.set_message(format!("into {target}"));
    let opts = RebuildOptions {
        live_url: global.database_url.clone(),
        into: args.into.clone(),
        swap: args.swap,
        batch_size: args.batch_size,
    };
    let started = Instant::now();
    let work = rebuild(&bus, &opts);
    tokio::pin!(work);
    // The rebuild reports only at its end: the bar follows the stream
    // sequences the new database has applied so far.
    let result = loop {
        tokio::select! {
            r = &mut work => break r,
            () = tokio::time::sleep(Duration::from_millis(250)) => {
                if !bar.is_hidden()
                    && let Some(seq) = applied_through(&target_url).await
                {
                    bar.set_position(seq.min(total));
                }
            }
        }
    };
    bar.finish_and_clear();
    let (url, done) = result.map_err(|e| Failure::Failed(format!("rebuild failed: {e:#}")))?;
    let seconds = started.elapsed().as_secs_f64();
    let (_, database) =
        runyard_store::split_database_url(&url).map_err(|e| Failure::Failed(e.to_string()))?;
    if global.json {
        out_json(&json!({
            "database": database,
            "swapped": args.swap,
            "messages": done.messages,
            "applied": done.applied,
            "skipped": done.skipped,
            "through": done.through,
            "seconds": seconds,
        }));
    } else {
        let mut text = table(
            &["", ""],
            vec![
                vec!["database".into(), database.clone()],
                vec!["messages read".into(), done.messages.to_string()],
                vec!["events applied".into(), done.applied.to_string()],
                vec!["skipped".into(), done.skipped.to_string()],
                vec!["through sequence".into(), done.through.to_string()],
                vec!["seconds".into(), format!("{seconds:.1}")],
            ],
        );
        text.push_str(&if args.swap {
            format!("\nThe rebuilt projection is live as {database:?}.\n")
        } else {
            format!(
                "\nRebuilt into {database:?}; the live database {live:?} is unchanged \
                 (swap it in with --swap).\n"
            )
        });
        out(&text);
    }
    Ok(EXIT_OK)
}

/// The highest stream sequence applied to the database being built, when
/// it exists yet.
async fn applied_through(url: &str) -> Option<u64> {
    let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(url)
        .await
        .ok()?;
    let seq: Option<i64> = sqlx::query_scalar("SELECT max(stream_seq) FROM applied_events")
        .fetch_one(&mut conn)
        .await
        .ok()?;
    let _ = sqlx::Connection::close(conn).await;
    seq.map(|s| s.max(0) as u64)
}
