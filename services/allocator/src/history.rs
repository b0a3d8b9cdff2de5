//! Where the model's history comes from: the projection at start, then
//! `UsageReported` events followed live on NATS (`runyard_bus::consumer`),
//! so a new usage report changes the next recommendation within a second.

use std::collections::{HashMap, HashSet};
use std::str::FromStr as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use runyard_bus::consumer::{
    Consumer, ConsumerConfig, Deliver, Delivery, Handler, HandlerError, Rejected,
};
use runyard_events::{Body, Event, FieldError, UsageReported, from_timestamp};
use sqlx::Row as _;
use tokio_util::sync::CancellationToken;

use crate::State;
use crate::model::{JobAttempt, Observation, Workload, full_key};
use sqlx::ConnectOptions as _;

/// How far before the load the live follow starts, so nothing published
/// while loading is missed (overlap is deduplicated by event id).
const OVERLAP: Duration = Duration::from_secs(600);

/// Loads every usage sample of the projection into the model. Returns the
/// ids of samples reported within [`OVERLAP`] of the start, which the live
/// follow may deliver again, and when the load started.
///
/// Rows are decoded here while a blocking thread feeds the model, so
/// Postgres, decoding and the model each keep a core busy; workloads come as
/// their stored `workload_key` (no JSON per row) and the protected-ref test
/// runs in the query, against the projected job's ref.
pub async fn load(state: &State) -> Result<(HashSet<String>, time::OffsetDateTime), sqlx::Error> {
    let started = time::OffsetDateTime::now_utc();
    let recent_after = started - OVERLAP;
    let clock = Instant::now();
    // A failed attempt may have fed part of the history: start every
    // attempt from an empty model so a retry never counts a sample twice.
    *state.model_write() = crate::model::Model::new(state.config.model.clone());
    let options = sqlx::postgres::PgConnectOptions::from_str(&state.config.database.url)?
        // A million-row stream is slow by design, not a slow statement.
        .disable_statement_logging();
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(Duration::from_secs(5))
        .connect_with(options)
        .await?;
    // Retry pipelines first: a kill in one follows its workload's kill in
    // the pipeline it retried.
    let links: Vec<(String, String, i64, i64)> = sqlx::query_as(
        "SELECT forge, instance, pipeline_id, new_pipeline_id FROM retries
         WHERE kind = 'issued' AND strategy = 'pipeline'
           AND pipeline_id IS NOT NULL AND new_pipeline_id IS NOT NULL
           AND occurred_at >= $1
         ORDER BY occurred_at",
    )
    .bind(oldest_loaded(&state.config, started))
    .fetch_all(&pool)
    .await?;
    {
        let mut model = state.model_write();
        for (forge, instance, old, new) in &links {
            let id = |v: &i64| u64::try_from(*v).unwrap_or(0);
            model.link_pipelines(forge, instance, id(old), id(new));
        }
    }
    let protected: Vec<&str> = state.protected.iter().map(String::as_str).collect();
    // Insertion order is time order up to small skews the model tolerates;
    // it streams from the primary key instead of sorting a million rows.
    // A sample trains only when the job's own (signed) webhook confirms
    // its ref: the projected job row exists and names the same ref, and
    // that ref is protected. A report whose job row is not projected yet
    // loads unprotected (it still counts for OOM streaks). One the job row
    // contradicts — another project than the report's (an identity
    // token's), or an attempt beyond the job's — is not loaded at all
    // (see [`judge`]); the table holds one sample per job attempt.
    let mut rows = sqlx::query(
        "SELECT u.workload_key,
                (j.ref IS NOT NULL AND j.ref = u.ref AND u.ref = ANY($1)) AS protected,
                u.peak_memory_bytes, u.memory_limit_bytes, u.memory_request_bytes,
                u.cpu_seconds, u.wall_seconds, u.oom_killed, u.reported_at,
                CASE WHEN u.reported_at >= $2 THEN u.event_id END AS recent_id,
                u.forge, u.instance, u.job_id, u.attempt, j.pipeline_id
         FROM usage_samples u
         LEFT JOIN jobs j
           ON j.forge = u.forge AND j.instance = u.instance AND j.job_id = u.job_id
         WHERE u.reported_at >= $3
           AND (u.project IS NULL OR j.project IS NULL OR lower(u.project) = lower(j.project))
           AND (j.run_attempt IS NULL OR u.attempt <= j.run_attempt)
         ORDER BY u.id",
    )
    .bind(&protected)
    .bind(recent_after)
    .bind(oldest_loaded(&state.config, started))
    .fetch(&pool);
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Chunk>(4);
    let feeder = {
        let state = state.clone();
        tokio::task::spawn_blocking(move || {
            let mut loaded = 0usize;
            state.model_write().set_replaying(true);
            while let Some(chunk) = rx.blocking_recv() {
                loaded += chunk.observations.len();
                state
                    .metrics
                    .samples_observed
                    .inc_by(chunk.observations.len() as u64);
                let mut model = state.model_write();
                for (key, obs) in chunk.iter() {
                    model.observe_key(key, obs);
                }
            }
            state.model_write().set_replaying(false);
            loaded
        })
    };
    let mut recent = HashSet::new();
    let mut chunk = Chunk::default();
    let outcome = loop {
        let row = match rows.next().await {
            Some(Ok(row)) => row,
            // A missing table (42P01) is no proof of an empty history: the
            // job-tracker may not have migrated yet, or a restore or a
            // rename left it elsewhere. Starting without it would serve
            // defaults for good, since the follow only reads recent
            // events; the caller retries until the projection is there.
            Some(Err(e)) => break Err(e),
            None => break Ok(()),
        };
        match decode(&row, &mut chunk) {
            Ok(Some(id)) => {
                recent.insert(id);
            }
            Ok(None) => {}
            Err(e) => break Err(e),
        }
        if chunk.observations.len() == Chunk::ROWS {
            // The feeder only stops early if it panicked; the join says so.
            let _ = tx.send(std::mem::take(&mut chunk)).await;
        }
    };
    let _ = tx.send(chunk).await;
    drop(tx);
    drop(rows);
    pool.close().await;
    let loaded = feeder
        .await
        .map_err(|e| sqlx::Error::Protocol(format!("history feeder failed: {e}")))?;
    outcome?;
    state.model_metrics();
    let (workloads, samples) = state.model_read().stats();
    tracing::info!(
        loaded,
        workloads,
        samples,
        seconds = clock.elapsed().as_secs_f64(),
        "history loaded"
    );
    Ok((recent, started))
}

/// The oldest sample a load at `now` reads: `allocator_history_days`
/// back, or all of them for 0.
fn oldest_loaded(config: &crate::Config, now: time::OffsetDateTime) -> time::OffsetDateTime {
    match config.allocator_history_days {
        0 => time::OffsetDateTime::UNIX_EPOCH - time::Duration::days(365_000),
        days => now - time::Duration::days(i64::from(days)),
    }
}

/// Decoded rows on their way to the model: the keys in one buffer.
#[derive(Debug, Default)]
struct Chunk {
    keys: String,
    ends: Vec<usize>,
    observations: Vec<Observation>,
}

impl Chunk {
    const ROWS: usize = 4096;

    fn iter(&self) -> impl Iterator<Item = (&str, Observation)> {
        let starts = std::iter::once(0).chain(self.ends.iter().copied());
        starts
            .zip(&self.ends)
            .zip(&self.observations)
            .map(|((start, &end), &obs)| (&self.keys[start..end], obs))
    }
}

/// Adds one projection row to `chunk`; returns its event id if it is recent.
fn decode(row: &sqlx::postgres::PgRow, chunk: &mut Chunk) -> Result<Option<String>, sqlx::Error> {
    let key: &str = row.try_get(0)?;
    let reported: time::OffsetDateTime = row.try_get(8)?;
    let bytes = |v: Option<i64>| v.and_then(|v| u64::try_from(v).ok());
    chunk.observations.push(Observation {
        at: reported.unix_timestamp() as f64,
        peak_memory_bytes: bytes(row.try_get(2)?).unwrap_or(0),
        memory_limit_bytes: bytes(row.try_get(3)?),
        memory_request_bytes: bytes(row.try_get(4)?),
        cpu_seconds: row.try_get(5)?,
        wall_seconds: row.try_get(6)?,
        oom_killed: row.try_get(7)?,
        protected: row.try_get::<Option<bool>, _>(1)?.unwrap_or(false),
        job: Some(JobAttempt::new(
            row.try_get(10)?,
            row.try_get(11)?,
            u64::try_from(row.try_get::<i64, _>(12)?).unwrap_or(0),
            row.try_get::<Option<i64>, _>(14)?
                .and_then(|p| u64::try_from(p).ok())
                .unwrap_or(0),
            u32::try_from(row.try_get::<i32, _>(13)?).unwrap_or(1),
        )),
    });
    chunk.keys.push_str(key);
    chunk.ends.push(chunk.keys.len());
    row.try_get(9)
}

/// Converts a usage event into the model's terms.
/// `job`: what the job's own (signed) webhooks said of it. A GitHub job's
/// workload wins over the report's (ARCHITECTURE: GitHub samples are keyed
/// from the job). The sample trains (`protected`) only when the webhook
/// names the report's ref and that ref is protected: a job not seen yet
/// (its webhook may come after the report) does not train now — the next
/// start's load, which joins the projected job row, decides again.
pub fn observation(
    state: &State,
    u: &UsageReported,
    event: &Event,
    job: Option<&KnownJob>,
) -> (Workload, Observation) {
    let at = event
        .occurred_at
        .as_ref()
        .or(event.received_at.as_ref())
        .and_then(from_timestamp)
        .unwrap_or_else(time::OffsetDateTime::now_utc);
    let workload: Workload = match job.and_then(|j| j.workload.as_ref()) {
        Some(w) => w.clone(),
        None => u
            .workload
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
    };
    let confirmed = job.is_some_and(|j| j.git_ref == u.r#ref);
    let obs = Observation {
        at: at.unix_timestamp() as f64,
        peak_memory_bytes: u.peak_memory_bytes,
        memory_limit_bytes: u.memory_limit_bytes,
        memory_request_bytes: u.memory_request_bytes,
        cpu_seconds: u.cpu_seconds,
        wall_seconds: u.wall_seconds,
        oom_killed: runyard_events::oom_killed(u),
        protected: confirmed && state.is_protected(&u.r#ref),
        job: u.job.as_ref().map(|k| {
            JobAttempt::new(
                runyard_events::forge_token(k.forge()),
                &k.instance,
                k.job_id,
                job.map_or(0, |j| j.pipeline_id),
                u.attempt.max(1),
            )
        }),
    };
    (workload, obs)
}

/// Follows `<ns>.v1.usage.>` from shortly before `since`, feeding the model,
/// until `stop` is cancelled. The consumer is ephemeral (this process's
/// model is its own); bound again after a failure, it carries on after the
/// last event it handled. `state.following` mirrors whether it is bound.
pub async fn follow(
    state: State,
    skip: HashSet<String>,
    since: time::OffsetDateTime,
    stop: CancellationToken,
) {
    let config = ConsumerConfig {
        durable: None,
        description: "runyard allocator: usage reports followed live".into(),
        // Jobs too: a sample trains only on the ref its job's webhook
        // names, and GitHub samples are keyed from the job.
        filter_subjects: vec![
            format!("{}.v1.usage.>", state.bus.namespace()),
            format!("{}.v1.job.github.>", state.bus.namespace()),
            format!("{}.v1.job.gitlab.>", state.bus.namespace()),
            // And retries: a pipeline a retry made links its kills to the
            // retried pipeline's.
            format!("{}.v1.retry.>", state.bus.namespace()),
        ],
        deliver: Deliver::ByStartTime(since - OVERLAP),
        batch_size: 256,
        // A new report should change the next recommendation at once.
        batch_wait: Duration::from_millis(5),
        span_name: "allocator observe usage",
        ..ConsumerConfig::default()
    };
    let consumer = Consumer::new(&state.bus, config, None);
    let mut ready = consumer.status().ready_changes();
    let mirror = async {
        loop {
            state
                .following
                .store(*ready.borrow_and_update(), Ordering::SeqCst);
            if ready.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    };
    let follower = UsageFollower {
        state: state.clone(),
        skip: Mutex::new(skip),
        fed_through: AtomicU64::new(0),
        jobs: Mutex::default(),
        pending: Mutex::default(),
        unplaced: Mutex::default(),
    };
    tokio::select! {
        () = consumer.run(follower, stop) => {}
        () = mirror => {}
    }
    state.following.store(false, Ordering::SeqCst);
}

/// Feeds followed usage reports to the model, once each.
struct UsageFollower {
    state: State,
    /// Reports the load already fed (the follow starts [`OVERLAP`] early).
    skip: Mutex<HashSet<String>>,
    /// The highest sequence fed: a message at or below it is a redelivery
    /// (an ack that did not arrive), since a consumer delivers in order.
    fed_through: AtomicU64,
    /// Jobs seen, by `(forge, instance, job id)`.
    jobs: Mutex<HashMap<JobRef, KnownJob>>,
    /// Identity-token reports of jobs not seen yet, by job.
    pending: Mutex<HashMap<JobRef, Vec<(UsageReported, Event)>>>,
    /// OOM-killed attempts fed before their job's webhook named its
    /// pipeline: the workload key and attempt, placed once it does.
    unplaced: Mutex<HashMap<JobRef, (String, u32)>>,
}

/// Jobs remembered for judging their usage (all are forgotten past this
/// many; the next start's load judges from the projection).
const JOBS_KEPT: usize = 200_000;

/// Reports of identity tokens waiting for their job's first webhook, at
/// most (past it they are dropped here; the next start's load judges them
/// from the projection).
const PENDING_KEPT: usize = 50_000;

/// What a job's (signed) webhooks say its usage is judged by.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct KnownJob {
    /// GitHub: `{repo, workflow, job}`, the key its usage is kept under;
    /// `None` on GitLab (the report's workload is the key) or before the
    /// webhook named the job.
    pub workload: Option<Workload>,
    /// The webhook's branch or tag.
    pub git_ref: String,
    /// The webhook's project (`owner/repo`, GitLab `path_with_namespace`).
    pub project: String,
    /// The highest attempt the webhooks named (GitHub `run_attempt`,
    /// GitLab `retries_count + 1`); 0 when none did.
    pub run_attempt: u32,
    /// The GitHub run or GitLab pipeline it is part of; 0 until a webhook
    /// named it.
    pub pipeline_id: u64,
    /// Attempts whose report was fed already.
    pub reported: Vec<u32>,
}

/// Why a report does not reach the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Contradiction {
    /// The report's project (an identity token's claim) is not the job's.
    Project,
    /// The job's webhooks named fewer attempts.
    Attempt,
    /// That attempt was reported already.
    Duplicate,
}

/// Judges a report against what its job's webhooks said: it is fed only
/// when its project (when it names one) is the job's, its attempt is one
/// the job had, and no report of that attempt was fed before.
pub fn judge(job: &KnownJob, u: &UsageReported) -> Result<(), Contradiction> {
    let attempt = u.attempt.max(1);
    if job.reported.contains(&attempt) {
        return Err(Contradiction::Duplicate);
    }
    if !u.project.is_empty()
        && !job.project.is_empty()
        && !u.project.eq_ignore_ascii_case(&job.project)
    {
        return Err(Contradiction::Project);
    }
    if job.run_attempt > 0 && attempt > job.run_attempt {
        return Err(Contradiction::Attempt);
    }
    Ok(())
}

impl UsageFollower {
    /// Remembers what a job's webhook says. A later observation that lacks
    /// a value keeps the one an earlier one gave.
    fn job_seen(&self, key: &JobRef, j: &runyard_events::JobObserved) {
        let github = key.0 == runyard_events::Forge::Github as i32;
        let workload = (github && !j.name.is_empty())
            .then(|| runyard_store::workload::github(&j.project, &j.workflow_name, &j.name));
        let mut jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        if jobs.len() >= JOBS_KEPT {
            jobs.clear();
        }
        let known = jobs.entry(key.clone()).or_default();
        if workload.is_some() {
            known.workload = workload;
        }
        if !j.r#ref.is_empty() {
            known.git_ref.clone_from(&j.r#ref);
        }
        if !j.project.is_empty() {
            known.project.clone_from(&j.project);
        }
        known.run_attempt = known.run_attempt.max(j.run_attempt);
        if j.pipeline_id != 0 {
            known.pipeline_id = j.pipeline_id;
        }
        drop(jobs);
        let unplaced = self
            .unplaced
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key);
        if let (Some((full, attempt)), true) = (unplaced, j.pipeline_id != 0) {
            let forge =
                runyard_events::Forge::try_from(key.0).map_or("", runyard_events::forge_token);
            self.state.model_write().place(
                &full,
                JobAttempt::new(forge, &key.1, key.2, j.pipeline_id, attempt),
            );
        }
    }

    /// An event over the limits: not used, counted and logged naming the
    /// field (never silently).
    fn refuse(&self, d: &Delivery, why: &FieldError) {
        tracing::warn!(event_id = %d.event.id, subject = %d.subject, seq = d.seq, reason = %why, "followed event not used: over the limits ingest holds events to (was it published around ingest?)");
        self.state.metrics.followed_refused.inc();
    }

    /// Feeds one report to the model, unless its job's webhooks contradict
    /// it ([`judge`]).
    fn feed(&self, key: &JobRef, u: &UsageReported, event: &Event) {
        let job = {
            let mut jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
            match jobs.get_mut(key) {
                Some(job) => {
                    if let Err(why) = judge(job, u) {
                        tracing::debug!(event_id = %event.id, ?why, "usage report not fed: its job's webhooks contradict it");
                        self.state.metrics.samples_refused.inc();
                        return;
                    }
                    job.reported.push(u.attempt.max(1));
                    Some(job.clone())
                }
                None => None,
            }
        };
        let (w, o) = observation(&self.state, u, event, job.as_ref());
        if o.oom_killed && job.as_ref().is_none_or(|j| j.pipeline_id == 0) {
            let mut unplaced = self.unplaced.lock().unwrap_or_else(|e| e.into_inner());
            if unplaced.len() >= PENDING_KEPT {
                unplaced.clear();
            }
            unplaced.insert(key.clone(), (full_key(&w), u.attempt.max(1)));
        }
        self.state.model_write().observe(&w, o);
        self.state.metrics.samples_observed.inc();
    }
}

/// A job: `(forge, instance, job id)`.
type JobRef = (i32, String, u64);

/// Why a followed usage report is over the caps ingest holds events to
/// ([`runyard_events::limits`]), if it is: the field and what is wrong.
/// Ingest publishes none such; one on the log came around it.
pub fn usage_over_limits(u: &UsageReported) -> Result<(), FieldError> {
    use runyard_events::limits::{MAX_WORKLOAD_ATTRIBUTES, text};
    if let Some(k) = &u.job {
        text("job.instance", &k.instance)?;
    }
    text("ref", &u.r#ref)?;
    text("project", &u.project)?;
    if u.workload.len() > MAX_WORKLOAD_ATTRIBUTES {
        return Err(FieldError::new(
            "workload",
            format!(
                "{} attributes, more than {MAX_WORKLOAD_ATTRIBUTES}",
                u.workload.len()
            ),
        ));
    }
    for (key, value) in &u.workload {
        // An oversized key is not echoed as part of a field name.
        text("workload", key)?;
        text(&format!("workload.{key}"), value)?;
    }
    Ok(())
}

/// [`usage_over_limits`] for the fields of a job event the follow keeps.
pub fn job_over_limits(j: &runyard_events::JobObserved) -> Result<(), FieldError> {
    use runyard_events::limits::text;
    if let Some(k) = &j.job {
        text("job.instance", &k.instance)?;
    }
    text("ref", &j.r#ref)?;
    text("project", &j.project)?;
    text("workflow_name", &j.workflow_name)?;
    text("name", &j.name)
}

impl Handler for UsageFollower {
    async fn handle(&self, batch: &[Delivery]) -> Result<Rejected, HandlerError> {
        for d in batch {
            if self.fed_through.fetch_max(d.seq, Ordering::SeqCst) >= d.seq {
                continue;
            }
            let u = match &d.event.body {
                Some(Body::UsageReported(u)) => {
                    if let Err(why) = usage_over_limits(u) {
                        self.refuse(d, &why);
                        continue;
                    }
                    u
                }
                Some(Body::JobObserved(j)) => {
                    if let Err(why) = job_over_limits(j) {
                        self.refuse(d, &why);
                        continue;
                    }
                    if let Some(key) = &j.job {
                        let key = (key.forge, key.instance.clone(), key.job_id);
                        self.job_seen(&key, j);
                        // Reports that waited for this job's webhook.
                        let waiting = self
                            .pending
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .remove(&key);
                        for (u, event) in waiting.unwrap_or_default() {
                            self.feed(&key, &u, &event);
                        }
                    }
                    continue;
                }
                Some(Body::RetryIssued(r)) => {
                    if let Some(t) = r.target.as_ref().filter(|_| r.strategy == "pipeline") {
                        if let Err(why) =
                            runyard_events::limits::text("target.instance", &t.instance)
                        {
                            self.refuse(d, &why);
                            continue;
                        }
                        self.state.model_write().link_pipelines(
                            runyard_events::forge_token(t.forge()),
                            &t.instance,
                            t.pipeline_id,
                            r.new_pipeline_id,
                        );
                    }
                    continue;
                }
                _ => continue,
            };
            {
                let mut skip = self.skip.lock().unwrap_or_else(|e| e.into_inner());
                if !skip.is_empty() && skip.remove(&d.event.id) {
                    continue;
                }
            }
            let Some(k) = u.job.as_ref() else {
                continue;
            };
            let key = (k.forge, k.instance.clone(), k.job_id);
            let known = self
                .jobs
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .contains_key(&key);
            let verified = u.identity.as_ref().is_some_and(|i| i.method == "oidc");
            if !known && verified {
                // A job's token speaks for it before its webhook may have
                // come: judged once the webhook says what the job is.
                let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
                if pending.len() >= PENDING_KEPT {
                    pending.clear();
                }
                pending
                    .entry(key)
                    .or_default()
                    .push((u.clone(), d.event.clone()));
                continue;
            }
            self.feed(&key, u, &d.event);
        }
        self.state.model_metrics();
        Ok(Vec::new())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use runyard_testkit::{TestDb, TestNats, unique_namespace};

    use crate::{App, Config};

    /// An allocator on `db` (not started) with `config`'s other settings,
    /// in a fresh namespace.
    async fn app(nats: &TestNats, db: &TestDb, config: Config) -> App {
        App::build(Config {
            bus: runyard_config::Bus {
                nats_url: nats.url(),
                namespace: unique_namespace().to_string(),
            },
            database: runyard_config::Database {
                url: db.url.clone(),
            },
            allocator_listen: "127.0.0.1:0".parse().unwrap(),
            allocator_http_listen: "127.0.0.1:0".parse().unwrap(),
            ..config
        })
        .await
        .unwrap()
    }

    /// Projected job rows, as the jobs' webhooks would leave them, for
    /// GitLab jobs `ids` of `ci.example` on `git_ref`.
    async fn confirm_jobs(pool: &sqlx::PgPool, ids: std::ops::RangeInclusive<i64>, git_ref: &str) {
        sqlx::query(
            "INSERT INTO jobs (forge, instance, job_id, status, ref, first_seen_at,
                last_event_at, rank_status, rank_at, rank_event)
             SELECT 'gitlab', 'ci.example', j, 4, $3, now(), now(), 4, now(), 'test'
             FROM generate_series($1::int8, $2::int8) AS j",
        )
        .bind(ids.start())
        .bind(ids.end())
        .bind(git_ref)
        .execute(pool)
        .await
        .unwrap();
    }

    #[tokio::test]
    async fn only_samples_whose_job_row_confirms_a_protected_ref_train_at_load() {
        let nats = TestNats::get().await;
        let db = TestDb::new();
        runyard_store::migrate(&db.url).await.unwrap();
        let pool = sqlx::PgPool::connect(&db.url).await.unwrap();
        // Jobs 1-8 report `develop`; 9-10 report a pull request's ref.
        sqlx::query(
            "INSERT INTO usage_samples (forge, instance, job_id, attempt, event_id, ref, workload,
                workload_key, peak_memory_bytes, memory_limit_bytes, cpu_seconds, wall_seconds,
                oom_killed, reported_at)
             SELECT 'gitlab', 'ci.example', j, 1, 'usage:gitlab:ci.example:' || j || ':1',
                CASE WHEN j <= 8 THEN 'develop' ELSE 'feature/x' END,
                '{\"package\": \"zlib\"}', 'package=zlib', 1000000000 + j * 1000000,
                4000000000, 60, 30, false, now() - (j || ' seconds')::interval
             FROM generate_series(1, 10) AS j",
        )
        .execute(&pool)
        .await
        .unwrap();
        // The webhooks: jobs 1-4 ran on develop; 5-6 are pull request jobs
        // that claim develop; 7-8 have no job row (yet); 9-10 are honest
        // pull request jobs.
        confirm_jobs(&pool, 1..=4, "develop").await;
        confirm_jobs(&pool, 5..=6, "feature/x").await;
        confirm_jobs(&pool, 9..=10, "feature/x").await;
        pool.close().await;
        let app = app(&nats, &db, Config::default()).await;
        super::load(&app.state).await.unwrap();
        let w: crate::model::Workload = [("package".to_owned(), "zlib".to_owned())].into();
        let answer = app.state.model_read().recommend(&w);
        assert_eq!(answer.basis.samples, 4, "{:?}", answer.basis);
        assert_eq!(app.state.model_read().stats(), (1, 4));
        db.drop_db().await;
    }

    /// Jobs 1..=n of `develop`, each one zlib sample (a second apart) and
    /// the job row that confirms its ref.
    async fn develop_zlib_samples(pool: &sqlx::PgPool, n: i64) {
        sqlx::query(
            "INSERT INTO usage_samples (forge, instance, job_id, attempt, event_id, ref, workload,
                workload_key, peak_memory_bytes, memory_limit_bytes, cpu_seconds, wall_seconds,
                oom_killed, reported_at)
             SELECT 'gitlab', 'ci.example', j, 1, 'usage:gitlab:ci.example:' || j || ':1',
                'develop', '{\"package\": \"zlib\"}', 'package=zlib', 1000000000 + j * 1000000,
                4000000000, 60, 30, false, now() - (j || ' seconds')::interval
             FROM generate_series(1, $1) AS j",
        )
        .bind(n)
        .execute(pool)
        .await
        .unwrap();
        confirm_jobs(pool, 1..=n, "develop").await;
    }

    #[tokio::test]
    async fn a_restart_keeps_each_kill_open_for_its_own_retry() {
        let nats = TestNats::get().await;
        let db = TestDb::new();
        runyard_store::migrate(&db.url).await.unwrap();
        let pool = sqlx::PgPool::connect(&db.url).await.unwrap();
        develop_zlib_samples(&pool, 6).await;
        // Job 100 (pipeline 50) killed at 2 GB; job 101 (pipeline 51)
        // passes at the same limit; runyard's retry made pipeline 60 from
        // 50, whose job 102 is killed again at 2.4 GB.
        for (job, pipeline, peak, oom, ago) in [
            (100i64, 50i64, 2_000_000_000i64, true, 30),
            (101, 51, 1_500_000_000, false, 20),
            (102, 60, 2_400_000_000, true, 10),
        ] {
            sqlx::query(
                "INSERT INTO usage_samples (forge, instance, job_id, attempt, event_id, ref,
                    workload, workload_key, peak_memory_bytes, memory_limit_bytes,
                    cpu_seconds, wall_seconds, oom_killed, reported_at)
                 VALUES ('gitlab', 'ci.example', $1, 1, 'usage:gitlab:ci.example:' || $1 || ':1',
                    'develop', '{\"package\": \"zlib\"}', 'package=zlib', $2, $2, 60, 30, $3,
                    now() - ($4 || ' milliseconds')::interval)",
            )
            .bind(job)
            .bind(peak)
            .bind(oom)
            .bind(ago.to_string())
            .execute(&pool)
            .await
            .unwrap();
            confirm_jobs(&pool, job..=job, "develop").await;
            sqlx::query("UPDATE jobs SET pipeline_id = $2 WHERE job_id = $1")
                .bind(job)
                .bind(pipeline)
                .execute(&pool)
                .await
                .unwrap();
        }
        sqlx::query(
            "INSERT INTO retries (event_id, kind, forge, instance, unit, pipeline_id, strategy,
                new_pipeline_id, jobs, occurred_at, received_at)
             VALUES ('retry:gitlab:ci.example:pipeline:50:issued', 'issued', 'gitlab',
                'ci.example', 'pipeline:50', 50, 'pipeline', 60, '[]', now() - interval '25 ms',
                now())",
        )
        .execute(&pool)
        .await
        .unwrap();
        pool.close().await;
        let app = app(&nats, &db, Config::default()).await;
        super::load(&app.state).await.unwrap();
        {
            let model = app.state.model_read();
            let w: crate::model::Workload = [("package".to_owned(), "zlib".to_owned())].into();
            let asked = |job, pipeline, attempt| {
                crate::model::JobAttempt::new("gitlab", "ci.example", job, pipeline, attempt)
            };
            // Pipeline 60's generate step: its job's second kill in a row.
            let retry = model.recommend_retry(&w, asked(0, 60, 0));
            assert!(retry.basis.oom_bump && retry.retry_count == 2, "{retry:?}");
            assert!(retry.memory_limit_bytes >= 2_880_000_000, "{retry:?}");
            // Job 100's kill was followed by pipeline 60's: closed.
            assert!(!model.recommend_retry(&w, asked(100, 50, 1)).basis.oom_bump);
            // A build that is no retry is not bumped.
            let plain = model.recommend(&w);
            assert!(!plain.basis.oom_bump && plain.retry_count == 0, "{plain:?}");
        }
        db.drop_db().await;
    }

    #[tokio::test]
    async fn a_missing_usage_table_fails_the_load_rather_than_loading_nothing() {
        let nats = TestNats::get().await;
        let db = TestDb::new();
        runyard_store::migrate(&db.url).await.unwrap();
        let pool = sqlx::PgPool::connect(&db.url).await.unwrap();
        develop_zlib_samples(&pool, 3).await;
        sqlx::query("ALTER TABLE usage_samples RENAME TO usage_samples_elsewhere")
            .execute(&pool)
            .await
            .unwrap();
        let app = app(&nats, &db, Config::default()).await;
        let error = super::load(&app.state).await.unwrap_err();
        let code = match &error {
            sqlx::Error::Database(e) => e.code().map(|c| c.into_owned()),
            _ => None,
        };
        assert_eq!(code.as_deref(), Some("42P01"), "{error}");
        sqlx::query("ALTER TABLE usage_samples_elsewhere RENAME TO usage_samples")
            .execute(&pool)
            .await
            .unwrap();
        pool.close().await;
        super::load(&app.state).await.unwrap();
        assert_eq!(
            app.state.model_read().stats(),
            (1, 3),
            "the history, once back"
        );
        db.drop_db().await;
    }

    #[tokio::test]
    async fn loading_again_counts_no_sample_twice() {
        // A load that fails half-way is retried: the retry must not add the
        // part the failed attempt already fed to the model.
        let nats = TestNats::get().await;
        let db = TestDb::new();
        runyard_store::migrate(&db.url).await.unwrap();
        let pool = sqlx::PgPool::connect(&db.url).await.unwrap();
        develop_zlib_samples(&pool, 12).await;
        pool.close().await;
        let app = app(&nats, &db, Config::default()).await;
        let state = &app.state;
        let (recent, _) = super::load(state).await.unwrap();
        assert_eq!(recent.len(), 12, "every sample is within the overlap");
        let once = state.model_read().stats();
        let w: crate::model::Workload = [("package".to_owned(), "zlib".to_owned())].into();
        let answer = state.model_read().recommend(&w);
        assert_eq!(once, (1, 12));
        super::load(state).await.unwrap();
        assert_eq!(state.model_read().stats(), once);
        assert_eq!(state.model_read().recommend(&w), answer);
        db.drop_db().await;
    }

    #[tokio::test]
    async fn a_load_reads_only_the_configured_days_of_history() {
        let nats = TestNats::get().await;
        let db = TestDb::new();
        runyard_store::migrate(&db.url).await.unwrap();
        let pool = sqlx::PgPool::connect(&db.url).await.unwrap();
        // 12 samples a day apart, the newest 5 days old.
        sqlx::query(
            "INSERT INTO usage_samples (forge, instance, job_id, attempt, event_id, ref, workload,
                workload_key, peak_memory_bytes, memory_limit_bytes, cpu_seconds, wall_seconds,
                oom_killed, reported_at)
             SELECT 'gitlab', 'ci.example', j, 1, 'usage:gitlab:ci.example:' || j || ':1',
                'develop', '{\"package\": \"zlib\"}', 'package=zlib', 1000000000,
                4000000000, 60, 30, false, now() - ((j + 4) || ' days')::interval
             FROM generate_series(1, 12) AS j",
        )
        .execute(&pool)
        .await
        .unwrap();
        confirm_jobs(&pool, 1..=12, "develop").await;
        pool.close().await;
        let mut held = Vec::new();
        for days in [10, 0] {
            let config = Config {
                allocator_history_days: days,
                ..Config::default()
            };
            let app = app(&nats, &db, config).await;
            super::load(&app.state).await.unwrap();
            held.push(app.state.model_read().stats().1);
            let text = app.state.registry.encode();
            let gauge = format!("runyard_allocator_samples {}", held.last().unwrap());
            assert!(text.contains(&gauge), "{text}");
        }
        // 10 days back: the samples 5–9 days old; 0: every one.
        assert_eq!(held, [5, 12]);
        db.drop_db().await;
    }
}
