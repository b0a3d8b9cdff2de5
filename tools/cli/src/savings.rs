//! `runyard savings`: what runyard did for a site over a window, per
//! project and in total, from the projection
//! ([`runyard_insight::savings`], which the console reads too). Every
//! figure comes with how it was computed (`how`), so it can be checked by
//! hand.

use clap::Args;
use serde_json::Value;

use crate::Failure;
use crate::query::connect_db;
use crate::{EXIT_OK, Global, out, out_json, table};

/// `runyard savings`.
#[derive(Args, Debug, Clone)]
pub struct SavingsArgs {
    /// The window, back from now: `30d`, `12h`, `1w`.
    #[arg(long, default_value = "30d", value_parser = crate::events::parse_duration)]
    pub since: std::time::Duration,
    /// The memory every job had before runyard sized it (a static
    /// default, as `16GiB` or `16000000000`): the baseline of the
    /// reserved memory. Without it, no baseline is shown.
    #[arg(long, value_name = "SIZE")]
    pub before_memory: Option<bytesize::ByteSize>,
    /// The operator's OOM target the first-attempt OOM rate is compared
    /// with.
    #[arg(
        long,
        env = "RUNYARD_ALLOCATOR_TARGET_OOM",
        default_value_t = 0.03,
        value_parser = parse_share
    )]
    pub target_oom: f64,
}

fn parse_share(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(t) if t > 0.0 && t < 0.5 => Ok(t),
        _ => Err(format!("{s:?}: a share between 0 and 0.5, e.g. 0.03")),
    }
}

/// `runyard savings`.
pub async fn savings(global: &Global, args: &SavingsArgs) -> Result<u8, Failure> {
    let db = connect_db(global).await?;
    let query = runyard_insight::savings::SavingsQuery {
        window: args.since,
        before_memory: args.before_memory.map(|b| b.as_u64()),
        before_memory_by_project: Default::default(),
        target_oom: args.target_oom,
    };
    let found = runyard_insight::savings::savings(&db, &query).await;
    db.close().await;
    let found = found.map_err(|e| crate::query::query_failed(e.table, &e.source))?;
    let report = serde_json::to_value(&found).unwrap_or_default();
    if global.json {
        out_json(&report);
        return Ok(EXIT_OK);
    }
    out(&savings_text(&report));
    Ok(EXIT_OK)
}

fn savings_text(report: &Value) -> String {
    let cell = |v: &Value| match v {
        Value::Null => "-".to_owned(),
        Value::Number(n) => n.to_string(),
        other => other.as_str().unwrap_or_default().to_owned(),
    };
    let pct = |v: &Value| {
        v.as_f64()
            .map_or("-".to_owned(), |x| format!("{:.1}%", x * 100.0))
    };
    let cols = [
        "project",
        "reports",
        "reserved_gb_h",
        "used_gb_h",
        "before_gb_h",
        "first_oom",
        "retries_ok",
        "wait_p50_s",
        "wait_p95_s",
    ];
    let row = |name: &str, f: &Value| {
        vec![
            name.to_owned(),
            cell(&f["reports"]),
            cell(&f["reserved_gb_hours"]),
            cell(&f["used_gb_hours"]),
            cell(&f["before_gb_hours"]),
            format!(
                "{} ({}/{})",
                pct(&f["first_attempt_oom_rate"]),
                cell(&f["first_attempts_oom_killed"]),
                cell(&f["first_attempts"])
            ),
            format!("{}/{}", cell(&f["retries_succeeded"]), cell(&f["retries"])),
            cell(&f["queue_wait_p50_seconds"]),
            cell(&f["queue_wait_p95_seconds"]),
        ]
    };
    let mut rows: Vec<Vec<String>> = report["projects"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| row(p["project"].as_str().unwrap_or_default(), p))
        .collect();
    rows.push(row("(all)", &report["total"]));
    let mut text = table(&cols, rows);
    let r = &report["runners"];
    text.push_str(&format!(
        "\nrunners {}: {} runner-minutes, {} idle; first-attempt OOM target {}\n\nhow:\n",
        cell(&r["runners"]),
        cell(&r["runner_minutes"]),
        cell(&r["idle_runner_minutes"]),
        pct(&report["total"]["target_oom"]),
    ));
    for (k, v) in runyard_insight::savings::HOW {
        text.push_str(&format!("  {k}: {v}\n"));
    }
    text
}
