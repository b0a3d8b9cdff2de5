//! The engine's operations: each runs off the loop, bounded, and reports
//! an [`Outcome`] (the events it published, and what the forge said that
//! is no event) that the loop folds in.

use std::sync::Arc;
use std::time::{Duration, Instant};

use runyard_events::{
    Body, Event, Forge, RunnerCreated, RunnerDeleted, RunnerFailed, RunnerRef, Source, forge_token,
    runner_event_id_for, timestamp,
};
use secrecy::{ExposeSecret as _, SecretString};

use super::{Local, Outcome, Pool, Shared, job_key, rref};
use crate::core::world::{JobId, Phase, Runner};
use crate::forges::Unregistered;
use crate::kv::Claim;
use crate::metadata::InstanceSecrets;
use crate::provider::tools::{ToolsCache, github_scope};
use crate::provider::{Bootstrap, CreateRequest, Instance, ProviderError};
use crate::sizing::runner_requested;
use runyard_forge::api::github::endpoint;

/// Removes what nothing owns under `name` (operation `op`): its forge
/// registration first, then its instance and secrets. A forge runner that
/// is busy (or could not be asked) keeps its instance: deleting that would
/// kill the job all the same. The next listings try again.
pub(super) async fn remove_orphan(
    shared: Arc<Shared>,
    p: Arc<Pool>,
    op: String,
    name: String,
    provider_id: Option<String>,
    forge_id: Option<u64>,
) -> Outcome {
    if let Some(id) = forge_id {
        match shared.io.forges.unregister(&p.config, id).await {
            Ok(Unregistered::Gone) => {}
            Ok(Unregistered::Busy(_)) => {
                tracing::info!(runner = %name, pool = %p.config.name, "orphan busy; kept until its job is done");
                return Outcome::unpublished(op, None);
            }
            Err(error) => {
                tracing::warn!(%error, runner = %name, "removing an orphan forge runner failed");
                return Outcome::unpublished(op, None);
            }
        }
    }
    if let Some(id) = provider_id {
        let r = p.delete_instance(&shared.io.metrics, &p.id, &id).await;
        if let Err(error) = &r {
            tracing::warn!(%error, runner = %name, "deleting an orphan instance failed");
        }
    }
    forget_secrets(&shared, &name).await;
    tracing::info!(runner = %name, pool = %p.config.name, "orphan removed");
    Outcome::unpublished(op, None)
}

/// Publishes a runner event and reports it as the operation's outcome.
pub(super) async fn record(shared: &Shared, p: &Pool, name: String, body: Body) -> Outcome {
    let events = publish(shared, p, &name, body).await;
    Outcome::Done {
        name,
        events,
        local: None,
    }
}

/// Publishes a runner event (retrying a few times) and returns it to be
/// folded in. The id is deterministic, so a retry never doubles it.
pub(super) async fn publish(shared: &Shared, p: &Pool, name: &str, body: Body) -> Vec<Event> {
    publish_for(shared, p.spec.forge as i32, &p.spec.instance, name, body).await
}

/// [`publish`] for a runner of the forge `forge` at `instance` (also one
/// of a pool no longer configured).
pub(super) async fn publish_for(
    shared: &Shared,
    forge: i32,
    instance: &str,
    name: &str,
    body: Body,
) -> Vec<Event> {
    let id = runner_event_id_for(&body).unwrap_or_default();
    let at = timestamp(time::OffsetDateTime::now_utc());
    let event = Event {
        id,
        occurred_at: Some(at),
        received_at: Some(at),
        source: Some(Source {
            forge,
            instance: instance.to_owned(),
            delivery_id: String::new(),
            hook_id: String::new(),
            producer: "scaler".into(),
        }),
        body: Some(body),
    };
    // The trace of the work that led to it, if any.
    let tp = runyard_bus::current_trace();
    for attempt in 0..5u32 {
        match shared.io.bus.publish_event(&event, &tp).await {
            Ok(_) => break,
            Err(error) => {
                tracing::warn!(%error, attempt, runner = %name, "publishing a runner event failed");
                tokio::time::sleep(Duration::from_millis(100 << attempt)).await;
            }
        }
    }
    vec![event]
}

/// Records a runner of a removed pool deleted (reason `pool_removed`).
pub(super) async fn pool_removed(shared: &Shared, rref: RunnerRef) -> Vec<Event> {
    let (forge, instance, name) = (rref.forge, rref.instance.clone(), rref.name.clone());
    let body = Body::RunnerDeleted(RunnerDeleted {
        runner: Some(rref),
        reason: "pool_removed".into(),
    });
    publish_for(shared, forge, &instance, &name, body).await
}

/// A runner whose instance its provider lists stopped (or in error), seen
/// twice: started again when the pool says so (`start`, once), else — or
/// when starting fails — removed and recorded `RunnerFailed` (a job's
/// runner is then made again after the create back-off, a free one
/// replaced by the policy), or `RunnerDeleted` when it had taken a job.
pub(super) async fn stopped_instance(
    shared: Arc<Shared>,
    p: Arc<Pool>,
    r: Runner,
    i: Instance,
    start: bool,
) -> Outcome {
    let name = r.name.clone();
    if start {
        let started = Instant::now();
        let result = p.provider.start(&p.id, &i.provider_id).await;
        shared
            .io
            .metrics
            .provider_call(&p.provider_name, "start", started, result.is_ok());
        match result {
            Ok(()) => {
                tracing::info!(runner = %name, pool = %p.config.name, "stopped instance started again");
                return Outcome::unpublished(name, None);
            }
            Err(error) => {
                tracing::warn!(%error, runner = %name, "starting the stopped instance failed; replacing it");
            }
        }
    }
    let reason = if i.status == "stopped" {
        "instance_stopped"
    } else {
        "instance_error"
    };
    tracing::info!(runner = %name, pool = %p.config.name, status = %i.status, fault = ?i.fault, "replacing the runner");
    match remove(&shared, &p, &r).await {
        Ok(Unregistered::Gone) => {
            let body = if r.phase == Phase::Assigned {
                Body::RunnerDeleted(RunnerDeleted {
                    runner: Some(rref(&p, &name)),
                    reason: reason.into(),
                })
            } else {
                let fault = i
                    .fault
                    .as_deref()
                    .map(|f| format!(": {f}"))
                    .unwrap_or_default();
                Body::RunnerFailed(RunnerFailed {
                    runner: Some(rref(&p, &name)),
                    reason: reason.into(),
                    error: format!("the provider lists the instance {}{fault}", i.status),
                    attempt: r.attempts,
                    given_up: false,
                    job: r.job.as_ref().map(job_key),
                })
            };
            record(&shared, &p, name, body).await
        }
        Ok(Unregistered::Busy(jobs)) => Outcome::unpublished(name, Some(Local::Busy(jobs))),
        Err(RemoveFailed::Forge | RemoveFailed::Instance) => Outcome::unpublished(name, None),
    }
}

/// Claims the job, checks it still waits, sizes it, records the request and
/// provisions the runner.
pub(super) async fn create_for_job(
    shared: Arc<Shared>,
    p: Arc<Pool>,
    job: crate::core::world::Job,
    name: String,
    key: String,
    tools: Arc<ToolsCache>,
) -> Outcome {
    let abandon = |name: String, started: bool| Outcome::Abandoned {
        name,
        job: started.then(|| job.id.clone()),
    };
    match shared.io.coord.claim(&key, &name).await {
        Ok(Claim::Won) => {}
        // Ours from an earlier life (or a dead replica's): adopt it.
        Ok(Claim::Held(holder)) if holder == name => {}
        Ok(Claim::Held(holder)) => {
            tracing::info!(claim = %key, %holder, "job claimed by another runner");
            return abandon(name, false);
        }
        Err(error) => {
            tracing::warn!(%error, claim = %key, "claiming failed; will retry");
            return abandon(name, false);
        }
    }
    if already_started(&shared, &job.id).await {
        tracing::info!(job_id = job.id.job_id, "job already started; no runner");
        return abandon(name, true);
    }
    let sizing = shared.io.size(&job, &p.config.flavors).await;
    let body = Body::RunnerRequested(runner_requested(
        rref(&p, &name),
        &p.config,
        Some(&job),
        key,
        "queued_job",
        Some(&sizing),
    ));
    let mut events = publish(&shared, &p, &name, body).await;
    let made = provision(&shared, &p, &tools, &name, sizing.flavor, 1).await;
    let local = made.local();
    events.extend(made.events);
    Outcome::Done {
        name,
        events,
        local,
    }
}

pub(super) async fn create_free(
    shared: Arc<Shared>,
    p: Arc<Pool>,
    name: String,
    key: String,
    reason: &'static str,
    tools: Arc<ToolsCache>,
) -> Outcome {
    let body = Body::RunnerRequested(runner_requested(
        rref(&p, &name),
        &p.config,
        None,
        key,
        reason,
        None,
    ));
    let mut events = publish(&shared, &p, &name, body).await;
    let made = provision(&shared, &p, &tools, &name, 0, 1).await;
    let local = made.local();
    events.extend(made.events);
    Outcome::Done {
        name,
        events,
        local,
    }
}

/// True when the projection says the job is running or done. The
/// projection may lag or be down: then the log's view decides, and after a
/// failed check the next ones are skipped for a few seconds, so a database
/// outage never slows creates down.
pub(super) async fn already_started(shared: &Shared, job: &JobId) -> bool {
    let Some(db) = &shared.io.db else {
        return false;
    };
    let down = |until: &mut Option<Instant>| until.is_some_and(|t| Instant::now() < t);
    if shared
        .io
        .db_down_until
        .lock()
        .is_ok_and(|mut u| down(&mut u))
    {
        return false;
    }
    let query = sqlx::query_scalar::<_, i16>(
        "SELECT status FROM jobs WHERE forge = $1 AND instance = $2 AND job_id = $3",
    )
    .bind(forge_token(job.forge))
    .bind(&job.instance)
    .bind(i64::try_from(job.job_id).unwrap_or(i64::MAX));
    match tokio::time::timeout(Duration::from_millis(500), query.fetch_optional(db)).await {
        Ok(Ok(status)) => status.is_some_and(|s| s >= 3),
        _ => {
            if let Ok(mut until) = shared.io.db_down_until.lock() {
                *until = Some(Instant::now() + Duration::from_secs(5));
            }
            false
        }
    }
}

/// What a create attempt published, and how long it waited before the
/// runner was registered.
pub(super) struct Provisioned {
    pub(super) events: Vec<Event>,
    waited: Duration,
}

impl Provisioned {
    pub(super) fn local(&self) -> Option<Local> {
        (!self.waited.is_zero()).then_some(Local::Waited(self.waited))
    }
}

/// A wait shorter than this is not worth moving the bootstrap clock for.
pub(super) const WAIT_WORTH_NOTING: Duration = Duration::from_secs(1);

/// One create attempt: register on the forge, create the instance. On
/// failure everything made is removed and `RunnerFailed` says why. An
/// external provider's instance also gets GitHub's runner downloads, its
/// secrets in the metadata API's store and a token to read them with.
/// GitHub's rate limit is waited out, however long: a spent budget fails no
/// attempt ([`crate::forges::Forges::wait_out`]).
pub(super) async fn provision(
    shared: &Shared,
    p: &Pool,
    tools: &ToolsCache,
    name: &str,
    flavor: usize,
    attempt: u32,
) -> Provisioned {
    let mut waited = Duration::ZERO;
    let events = provision_inner(shared, p, tools, name, flavor, attempt, &mut waited).await;
    Provisioned {
        events,
        waited: if waited < WAIT_WORTH_NOTING {
            Duration::ZERO
        } else {
            waited
        },
    }
}

pub(super) async fn provision_inner(
    shared: &Shared,
    p: &Pool,
    tools: &ToolsCache,
    name: &str,
    flavor: usize,
    attempt: u32,
    waited: &mut Duration,
) -> Vec<Event> {
    let started = Instant::now();
    let flavor = &p.config.flavors[flavor.min(p.config.flavors.len() - 1)];
    // The semaphore is never closed; a closed one would only lift the bound.
    let _slot = shared.io.create_slots.acquire().await.ok();
    let external = p.provider.is_external();
    // Read before anything is registered: a failure leaves nothing to undo.
    let downloads = if external && p.spec.forge == Forge::Github {
        match (
            shared.io.forges.github_for(&p.config.scope).ok(),
            github_scope(&p.config.scope),
        ) {
            (Some(github), Some(scope)) => match shared
                .io
                .forges
                .wait_out(github, &scope, endpoint::LIST_RUNNER_DOWNLOADS, || {
                    tools.get(github, &scope)
                })
                .await
            {
                Ok(list) => list,
                Err(error) => {
                    tracing::warn!(%error, runner = %name, attempt, "reading the runner downloads failed");
                    let error = format!("reading the runner downloads: {error}");
                    return fail(shared, p, name, attempt, "forge_error", &error).await;
                }
            },
            // Without a GitHub client the registration below says so.
            _ => Vec::new(),
        }
    } else {
        Vec::new()
    };
    let reg = match shared.io.forges.register(&p.config, name).await {
        Ok(r) => r,
        Err(error) => {
            tracing::warn!(%error, runner = %name, attempt, "registering the runner failed");
            return fail(shared, p, name, attempt, "forge_error", &error.to_string()).await;
        }
    };
    *waited = started.elapsed();
    let mut labels = p.config.labels.clone();
    labels.push(crate::forges::pool_label(&p.config.name));
    let req = CreateRequest {
        name: name.to_owned(),
        pool: p.config.name.clone(),
        pool_id: p.id.clone(),
        flavor: flavor.name.clone(),
        memory_bytes: flavor.memory.as_u64(),
        cpus: flavor.cpus,
        image: p.config.image.clone(),
        labels,
        jit_config: reg.jit_config,
        repo_url: repo_url(p),
        runner_group: String::new(),
        extra_specs: p.config.extra_specs_json(),
        timeout: p.config.bootstrap_timeout,
    };
    let boot = if external {
        match bootstrap(shared, p, &req, downloads, attempt).await {
            Ok(boot) => boot,
            Err(error) => {
                tracing::warn!(%error, runner = %name, attempt, "preparing the instance's bootstrap failed");
                forget_secrets(shared, name).await;
                let _ = shared.io.forges.unregister(&p.config, reg.runner_id).await;
                return fail(shared, p, name, attempt, "metadata_error", &error).await;
            }
        }
    } else {
        Bootstrap::default()
    };
    let started = Instant::now();
    // The provider bounds the call itself (killing what it started); this
    // only catches one that would not.
    let bound = p.config.bootstrap_timeout + Duration::from_secs(5);
    let created = match tokio::time::timeout(bound, p.provider.create_with(&req, &boot)).await {
        Ok(r) => r,
        Err(_) => Err(ProviderError::Timeout(p.config.bootstrap_timeout)),
    };
    shared
        .io
        .metrics
        .provider_call(&p.provider_name, "create", started, created.is_ok());
    match created {
        Ok(instance) => {
            tracing::info!(
                runner = %name,
                provider_id = %instance.provider_id,
                status = %instance.status,
                os = %instance.os_name,
                addresses = ?instance.addresses.iter().map(|a| a.address.as_str()).collect::<Vec<_>>(),
                "instance created"
            );
            let body = Body::RunnerCreated(RunnerCreated {
                runner: Some(rref(p, name)),
                provider_id: instance.provider_id,
                forge_runner_id: Some(reg.runner_id),
                attempt,
                status: instance.status,
            });
            publish(shared, p, name, body).await
        }
        Err(error) => {
            tracing::warn!(%error, runner = %name, attempt, "creating the instance failed");
            // Nothing half-made stays: the instance (by its provider id when
            // the provider gave one, else by name), its secrets and the
            // registration go.
            let target = match &error {
                ProviderError::InstanceError { provider_id, .. } => provider_id.clone(),
                _ => name.to_owned(),
            };
            let deleted = p.delete_instance(&shared.io.metrics, &p.id, &target).await;
            if let Err(e) = &deleted {
                tracing::warn!(error = %e, runner = %name, "deleting the failed instance failed");
            }
            forget_secrets(shared, name).await;
            let _ = shared.io.forges.unregister(&p.config, reg.runner_id).await;
            fail(
                shared,
                p,
                name,
                attempt,
                "create_failed",
                &error.to_string(),
            )
            .await
        }
    }
}

/// The bootstrap an external provider's instance gets: a token for this
/// attempt (valid for the pool's bootstrap timeout), its secrets stored
/// where the metadata API reads them, the API's URLs and the runner
/// downloads.
pub(super) async fn bootstrap(
    shared: &Shared,
    p: &Pool,
    req: &CreateRequest,
    tools: Vec<runyard_forge::api::github::RunnerDownload>,
    attempt: u32,
) -> Result<Bootstrap, String> {
    let meta = shared.metadata.as_ref().ok_or_else(|| {
        "the instance metadata API is off (RUNYARD_SCALER_INSTANCE_TOKEN_KEY is not set)".to_owned()
    })?;
    // A nonce per attempt: a leftover instance of an earlier attempt of
    // this name holds a token the new secrets refuse.
    let secrets = InstanceSecrets {
        name: req.name.clone(),
        pool: req.pool.clone(),
        forge: p.spec.forge,
        jit_config: req.jit_config.expose_secret().to_owned(),
        repo_url: req.repo_url.clone(),
        labels: req.labels.clone(),
        runner_group: req.runner_group.clone(),
        nonce: InstanceSecrets::new_nonce(),
    };
    let token = meta
        .tokens
        .mint_for(&secrets, attempt, p.config.bootstrap_timeout)
        .map_err(|e| e.to_string())?;
    meta.store.put(&secrets).await.map_err(|e| e.to_string())?;
    Ok(Bootstrap {
        tools,
        callback_url: meta.callback_url.clone(),
        metadata_url: meta.metadata_url.clone(),
        instance_token: SecretString::from(token),
        os_type: p.config.os_type.clone(),
        os_arch: p.config.os_arch.clone(),
        forge: p.spec.forge,
    })
}

/// Removes an instance's bootstrap secrets (its token opens nothing then).
pub(super) async fn forget_secrets(shared: &Shared, name: &str) {
    if let Some(meta) = &shared.metadata {
        meta.store.remove(name).await;
    }
}

pub(super) async fn fail(
    shared: &Shared,
    p: &Pool,
    name: &str,
    attempt: u32,
    reason: &str,
    error: &str,
) -> Vec<Event> {
    let body = Body::RunnerFailed(RunnerFailed {
        runner: Some(rref(p, name)),
        reason: reason.into(),
        error: error.chars().take(500).collect(),
        attempt,
        given_up: false,
        job: None,
    });
    publish(shared, p, name, body).await
}

pub(super) fn repo_url(p: &Pool) -> String {
    let s = &p.config.scope;
    let host = &p.spec.instance;
    match (&s.repo, &s.org, &s.enterprise) {
        (Some(r), _, _) => format!("https://{host}/{r}"),
        (_, Some(o), _) => format!("https://{host}/{o}"),
        (_, _, Some(e)) => format!("https://{host}/enterprises/{e}"),
        _ => format!("https://{host}"),
    }
}

/// Which step of a removal failed; the error itself is logged where it
/// happened, and the next sync cycle tries again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RemoveFailed {
    /// Unregistering the forge's runner.
    Forge,
    /// Deleting the provider's instance.
    Instance,
}

/// Removes a runner: from the forge first (so it takes no job), then its
/// instance. `Busy` (nothing removed) when the forge says it runs a job.
pub(super) async fn remove(
    shared: &Shared,
    p: &Pool,
    r: &Runner,
) -> Result<Unregistered, RemoveFailed> {
    if let Some(id) = r.forge_runner_id {
        match shared.io.forges.unregister(&p.config, id).await {
            Ok(Unregistered::Busy(jobs)) => return Ok(Unregistered::Busy(jobs)),
            Ok(Unregistered::Gone) => {}
            Err(error) => {
                tracing::warn!(%error, runner = %r.name, "removing the forge runner failed");
                return Err(RemoveFailed::Forge);
            }
        }
    }
    let target = r.provider_id.clone().unwrap_or_else(|| r.name.clone());
    let deleted = p.delete_instance(&shared.io.metrics, &p.id, &target).await;
    match deleted {
        Ok(()) => {
            forget_secrets(shared, &r.name).await;
            Ok(Unregistered::Gone)
        }
        Err(error) => {
            tracing::warn!(%error, runner = %r.name, "deleting the instance failed");
            Err(RemoveFailed::Instance)
        }
    }
}

/// One step of the idle confirmation: read the forge (GitLab: the runner
/// and its running jobs); after a full window of idle readings, delete
/// (GitHub refuses with 422 if it turned busy; a GitLab runner is paused
/// and its jobs asked once more first). A paused idle runner goes at once.
pub(super) async fn confirm_idle(
    shared: Arc<Shared>,
    p: Arc<Pool>,
    r: Runner,
    window_passed: bool,
) -> Outcome {
    let name = r.name.clone();
    let done = |local| Outcome::unpublished(name.clone(), local);
    let Some(id) = r.forge_runner_id else {
        return done(None);
    };
    match shared.io.forges.runner(&p.config, id).await {
        Ok(Some(f)) if f.busy => return done(Some(Local::Busy(f.running_jobs))),
        // Paused (GitLab, by an earlier removal that found it busy): it
        // gets no job, so nothing is to be waited for.
        Ok(Some(f)) if f.paused => {}
        Ok(_) if !window_passed => return done(Some(Local::Idle)),
        Ok(_) => {}
        Err(error) => {
            tracing::warn!(%error, runner = %name, "reading the forge runner failed");
            return done(None);
        }
    }
    match remove(&shared, &p, &r).await {
        Ok(Unregistered::Gone) => {
            let body = Body::RunnerDeleted(RunnerDeleted {
                runner: Some(rref(&p, &name)),
                reason: "idle_timeout".into(),
            });
            record(&shared, &p, name, body).await
        }
        Ok(Unregistered::Busy(jobs)) => done(Some(Local::Busy(jobs))),
        Err(RemoveFailed::Forge | RemoveFailed::Instance) => done(None),
    }
}
