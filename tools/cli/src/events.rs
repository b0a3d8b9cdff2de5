//! `runyard events tail`: prints what the event log holds, one line (or one
//! JSON object) per event, oldest first, and optionally follows it.

use std::time::Duration;

use async_nats::jetstream::{self, consumer};
use clap::Args;
use futures::StreamExt as _;
use prost::Message as _;
use runyard_events::{Body, Event, JobKey, Namespace};
use serde_json::{Value, json};

use crate::{EXIT_OK, Failure, Global, out};

/// `runyard events tail`.
#[derive(Args, Debug, Clone)]
pub struct TailArgs {
    /// Only these subjects (repeatable; NATS wildcards). Relative to
    /// `<ns>.v1.` unless they start with the namespace: `job.github.>`,
    /// `runner.*.failed`, `usage.>`.
    #[arg(long, short)]
    pub subject: Vec<String>,
    /// Keep following new events instead of stopping at the end.
    #[arg(long, short)]
    pub follow: bool,
    /// The raw-delivery stream (`<NS>_RAW`: headers and body size) instead.
    #[arg(long)]
    pub raw: bool,
    /// Only what the stream stored in this last stretch of time (`90s`,
    /// `30m`, `6h`, `2d`), instead of the whole log.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub since: Option<Duration>,
    /// Only the messages of this trace (32 hex digits: the `trace_id` of a
    /// log line, or of another message here): one delivery's whole story.
    #[arg(long, value_name = "TRACE_ID", value_parser = parse_trace_id)]
    pub trace: Option<u128>,
    /// Only the story of this job (`ID`, or `FORGE:INSTANCE:ID` when ids of
    /// two forges could meet): its webhooks and polls, its pipeline, the
    /// runners requested or assigned for it and everything that happened
    /// to them, its usage reports, and the retries that name it.
    #[arg(long, value_name = "JOB", value_parser = parse_job)]
    pub job: Option<JobFilter>,
}

/// Which job `--job` follows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobFilter {
    /// `github` / `gitlab`, when given.
    pub forge: Option<String>,
    /// The forge's host, when given.
    pub instance: Option<String>,
    /// The forge's job id.
    pub job_id: u64,
}

/// `4711` or `gitlab:gitlab.example.com:4711`.
pub fn parse_job(s: &str) -> Result<JobFilter, String> {
    let bad = || {
        format!("{s:?} is not a job: ID or FORGE:INSTANCE:ID (e.g. gitlab:gitlab.example.com:4711)")
    };
    let parts: Vec<&str> = s.split(':').collect();
    match parts.as_slice() {
        [id] => Ok(JobFilter {
            forge: None,
            instance: None,
            job_id: id.parse().map_err(|_| bad())?,
        }),
        [forge, instance, id] if matches!(*forge, "github" | "gitlab") && !instance.is_empty() => {
            Ok(JobFilter {
                forge: Some((*forge).to_owned()),
                instance: Some((*instance).to_owned()),
                job_id: id.parse().map_err(|_| bad())?,
            })
        }
        _ => Err(bad()),
    }
}

impl JobFilter {
    fn names(&self, k: Option<&JobKey>) -> bool {
        k.is_some_and(|k| {
            k.job_id == self.job_id
                && self
                    .forge
                    .as_deref()
                    .is_none_or(|f| f == runyard_events::forge_token(k.forge()))
                && self.instance.as_deref().is_none_or(|i| i == k.instance)
        })
    }
}

/// Follows one job's story through the log: the runners made for it or
/// handed it are remembered as they appear, so their later events (which
/// name only the runner) belong to it too.
#[derive(Debug)]
struct Story {
    job: JobFilter,
    runners: std::collections::HashSet<String>,
}

impl Story {
    fn admits(&mut self, event: &Event) -> bool {
        let job = &self.job;
        match &event.body {
            Some(Body::JobObserved(j)) => job.names(j.job.as_ref()),
            Some(Body::UsageReported(u)) => job.names(u.job.as_ref()),
            Some(Body::JobUnserved(u)) => job.names(u.job.as_ref()),
            Some(Body::PipelineObserved(p)) => {
                p.job_ids.contains(&job.job_id)
                    && job
                        .forge
                        .as_deref()
                        .is_none_or(|f| f == runyard_events::forge_token(p.forge()))
            }
            Some(Body::RetryRequested(r)) => r.jobs.iter().any(|j| job.names(j.job.as_ref())),
            Some(Body::RetryIssued(r)) => r.jobs.iter().any(|j| job.names(j.job.as_ref())),
            Some(Body::RetryRefused(r)) => r.jobs.iter().any(|j| job.names(j.job.as_ref())),
            Some(b @ (Body::RunnerRequested(_) | Body::RunnerAssigned(_))) => {
                let named = match b {
                    Body::RunnerRequested(q) => job.names(q.job.as_ref()),
                    Body::RunnerAssigned(a) => job.names(a.job.as_ref()),
                    _ => false,
                };
                let name = runyard_events::runner_ref(b).map(|r| r.name.clone());
                if named && let Some(name) = &name {
                    self.runners.insert(name.clone());
                }
                named || name.is_some_and(|n| self.runners.contains(&n))
            }
            Some(b) => {
                runyard_events::runner_ref(b).is_some_and(|r| self.runners.contains(&r.name))
            }
            None => false,
        }
    }
}

/// A trace id as logs and `--json` print it: 32 hex digits, not all zero.
pub fn parse_trace_id(s: &str) -> Result<u128, String> {
    match u128::from_str_radix(s, 16) {
        Ok(id) if s.len() == 32 && id != 0 => Ok(id),
        _ => Err(format!(
            "{s:?} is not a trace id (32 hex digits, not all zero)"
        )),
    }
}

/// The trace a message belongs to: its `traceparent` header's trace id.
fn trace_of(msg: &jetstream::Message) -> Option<u128> {
    let tp = msg.headers.as_ref()?.get(runyard_bus::TRACEPARENT_HEADER)?;
    runyard_bus::TraceParent::parse(tp.as_str()).map(|t| t.trace_id)
}

pub use runyard_insight::parse_duration;

/// The full subject filter for a `--subject` value.
pub fn subject_filter(ns: &Namespace, raw: bool, s: &str) -> String {
    let prefix = format!("{}.", ns.as_str());
    if s.starts_with(&prefix) {
        s.to_owned()
    } else if raw {
        format!("{prefix}raw.{s}")
    } else {
        format!("{prefix}v1.{s}")
    }
}

/// Runs `runyard events tail`.
pub async fn tail(global: &Global, args: &TailArgs) -> Result<u8, Failure> {
    if args.raw && args.job.is_some() {
        return Err(Failure::Usage(
            "--job follows a job through the event log; --raw shows deliveries, which name no job"
                .to_owned(),
        ));
    }
    let ns = global.ns()?;
    let filters: Vec<String> = args
        .subject
        .iter()
        .map(|s| subject_filter(&ns, args.raw, s))
        .collect();
    for f in &filters {
        if f.is_empty() || f.contains(' ') || f.split('.').any(str::is_empty) {
            return Err(Failure::Usage(format!(
                "subject {f:?} is not a valid filter"
            )));
        }
    }
    let client = global
        .nats_client("runyard-cli")
        .await
        .map_err(Failure::Failed)?;
    let js = jetstream::new(client);
    let name = if args.raw {
        ns.raw_stream()
    } else {
        ns.events_stream()
    };
    let stream = js.get_stream(&name).await.map_err(|e| {
        Failure::Failed(format!(
            "stream {name}: {e} (is the namespace right? `runyard doctor` checks)"
        ))
    })?;
    // An ordered consumer, not `runyard_bus::consumer`: tail only reads.
    // The bus consumer acks (moving a durable's position or holding an
    // ephemeral's acks), sends undecodable messages back and finally
    // dead-letters them — a publish into the very log being inspected —
    // and only decodes events, while tail prints undecodable messages as
    // they are and also reads the raw-delivery stream. An ordered consumer
    // has no acks and leaves nothing behind on the server.
    let consumer = stream
        .create_consumer(consumer::pull::OrderedConfig {
            deliver_policy: match args.since {
                Some(d) => consumer::DeliverPolicy::ByStartTime {
                    start_time: time::OffsetDateTime::now_utc() - d,
                },
                None => consumer::DeliverPolicy::All,
            },
            filter_subjects: filters,
            ..Default::default()
        })
        .await
        .map_err(|e| Failure::Failed(format!("reading stream {name}: {e}")))?;
    // What there is to print as the consumer starts, so a tail without
    // --follow knows when it is done (and that it has nothing to wait for).
    if consumer.cached_info().num_pending == 0 && !args.follow {
        return Ok(EXIT_OK);
    }
    let mut story = args.job.clone().map(|job| Story {
        job,
        runners: std::collections::HashSet::new(),
    });
    let mut messages = consumer
        .messages()
        .await
        .map_err(|e| Failure::Failed(format!("reading stream {name}: {e}")))?;
    loop {
        // Without --follow, a stream that stops answering is a failure, not
        // a hang.
        let next = if args.follow {
            messages.next().await
        } else {
            tokio::time::timeout(
                global.timeout().max(Duration::from_secs(10)),
                messages.next(),
            )
            .await
            .map_err(|_| Failure::Failed(format!("stream {name} stopped delivering")))?
        };
        let Some(msg) = next else { break };
        let msg = msg.map_err(|e| Failure::Failed(format!("reading stream {name}: {e}")))?;
        let (seq, pending) = msg
            .info()
            .map(|i| (i.stream_sequence, i.pending))
            .unwrap_or_default();
        let in_story = match (&mut story, args.raw) {
            (Some(story), false) => {
                Event::decode(msg.payload.clone()).is_ok_and(|e| story.admits(&e))
            }
            _ => true,
        };
        if in_story && (args.trace.is_none() || trace_of(&msg) == args.trace) {
            let line = if args.raw {
                raw_line(&msg, seq, global.json)
            } else {
                event_line(&msg, seq, global.json)
            };
            out(&line);
        }
        if !args.follow && pending == 0 {
            break;
        }
    }
    Ok(EXIT_OK)
}

fn raw_line(msg: &jetstream::Message, seq: u64, json: bool) -> String {
    let headers: Vec<(String, String)> = msg
        .headers
        .iter()
        .flat_map(|h| h.iter())
        .flat_map(|(k, vs)| vs.iter().map(move |v| (k.to_string(), v.to_string())))
        .collect();
    if json {
        let h: serde_json::Map<String, Value> = headers
            .into_iter()
            .map(|(k, v)| (k, Value::String(v)))
            .collect();
        return format!(
            "{}\n",
            json!({"seq": seq, "subject": msg.subject.as_str(), "bytes": msg.payload.len(), "headers": h})
        );
    }
    let h: Vec<String> = headers.iter().map(|(k, v)| format!("{k}={v}")).collect();
    format!(
        "#{seq} {} {} bytes {}\n",
        msg.subject,
        msg.payload.len(),
        h.join(" ")
    )
}

fn event_line(msg: &jetstream::Message, seq: u64, json: bool) -> String {
    match Event::decode(msg.payload.clone()) {
        Ok(event) if json => format!(
            "{}\n",
            json!({
                "seq": seq,
                "subject": msg.subject.as_str(),
                "trace_id": trace_of(msg).map(|t| format!("{t:032x}")),
                "event": event_json(&event),
            })
        ),
        Ok(event) => format!("#{seq} {} {}\n", msg.subject, describe(&event)),
        Err(e) if json => format!(
            "{}\n",
            json!({"seq": seq, "subject": msg.subject.as_str(), "undecodable": e.to_string()})
        ),
        Err(e) => format!("#{seq} {} undecodable: {e}\n", msg.subject),
    }
}

fn job_id(k: Option<&JobKey>) -> u64 {
    k.map(|k| k.job_id).unwrap_or_default()
}

fn time(t: Option<&prost_types::Timestamp>) -> Value {
    t.and_then(runyard_events::from_timestamp)
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .map_or(Value::Null, Value::String)
}

fn job_key_json(k: Option<&JobKey>) -> Value {
    match k {
        Some(k) => json!({
            "forge": runyard_events::forge_token(k.forge()),
            "instance": k.instance,
            "job_id": k.job_id,
        }),
        None => Value::Null,
    }
}

/// The event as JSON: the envelope, its type, and the body's main fields.
pub fn event_json(event: &Event) -> Value {
    let source = event.source.as_ref().map_or(Value::Null, |s| {
        json!({
            "forge": runyard_events::forge_token(s.forge()),
            "instance": s.instance,
            "delivery_id": s.delivery_id,
            "producer": s.producer,
        })
    });
    let body = match &event.body {
        Some(Body::JobObserved(j)) => json!({
            "job": job_key_json(j.job.as_ref()),
            "project": j.project,
            "pipeline_id": j.pipeline_id,
            "run_attempt": j.run_attempt,
            "name": j.name,
            "workflow_name": j.workflow_name,
            "labels": j.labels,
            "status": runyard_events::status_token(j.status()),
            "forge_status": j.forge_status,
            "conclusion": format!("{:?}", j.conclusion()).to_lowercase(),
            "failure_reason": j.failure_reason,
            "runner_name": j.runner_name,
            "ref": j.r#ref,
        }),
        Some(Body::PipelineObserved(p)) => json!({
            "forge": runyard_events::forge_token(p.forge()),
            "instance": p.instance,
            "pipeline_id": p.pipeline_id,
            "project": p.project,
            "ref": p.r#ref,
            "status": p.status,
            "job_ids": p.job_ids,
        }),
        Some(Body::UsageReported(u)) => json!({
            "job": job_key_json(u.job.as_ref()),
            "attempt": u.attempt,
            "ref": u.r#ref,
            "workload": u.workload,
            "peak_memory_bytes": u.peak_memory_bytes,
            "memory_limit_bytes": u.memory_limit_bytes,
            "cpu_seconds": u.cpu_seconds,
            "wall_seconds": u.wall_seconds,
            "oom_killed": u.oom_killed,
            "exit_code": u.exit_code,
        }),
        Some(Body::AllocationIssued(a)) => json!({
            "workload_key": a.workload_key,
            "ref": a.r#ref,
            "memory_limit_bytes": a.memory_limit_bytes,
            "memory_request_bytes": a.memory_request_bytes,
            "cpu_request_millicores": a.cpu_request_millicores,
            "retry_count": a.retry_count,
            "samples": a.samples,
            "statistic": a.statistic,
        }),
        Some(b @ Body::RunnerRequested(_))
        | Some(b @ Body::RunnerCreated(_))
        | Some(b @ Body::RunnerOnline(_))
        | Some(b @ Body::RunnerAssigned(_))
        | Some(b @ Body::RunnerFailed(_))
        | Some(b @ Body::RunnerDeleted(_)) => {
            let r = runyard_events::runner_ref(b);
            let mut v = json!({
                "pool": r.map(|r| r.pool.clone()),
                "name": r.map(|r| r.name.clone()),
                "state": runyard_events::runner_state(b),
            });
            let extra = match b {
                Body::RunnerRequested(q) => json!({"reason": q.reason, "flavor": q.flavor,
                    "job": job_key_json(q.job.as_ref()), "memory_bytes": q.memory_bytes}),
                Body::RunnerCreated(c) => json!({"attempt": c.attempt, "status": c.status,
                    "provider_id": c.provider_id}),
                Body::RunnerOnline(o) => json!({"source": o.source}),
                Body::RunnerAssigned(a) => json!({"job": job_key_json(a.job.as_ref())}),
                Body::RunnerFailed(f) => json!({"reason": f.reason, "attempt": f.attempt,
                    "given_up": f.given_up, "error": f.error}),
                Body::RunnerDeleted(d) => json!({"reason": d.reason}),
                _ => json!({}),
            };
            if let (Some(v), Value::Object(extra)) = (v.as_object_mut(), extra) {
                v.extend(extra);
            }
            v
        }
        Some(Body::RetryRequested(r)) => json!({
            "unit": r.target.as_ref().map(|t| t.unit.clone()),
            "strategy": r.strategy,
            "jobs": r.jobs.iter().map(|j| job_id(j.job.as_ref())).collect::<Vec<_>>(),
        }),
        Some(Body::RetryIssued(r)) => json!({
            "unit": r.target.as_ref().map(|t| t.unit.clone()),
            "strategy": r.strategy,
            "jobs": r.jobs.iter().map(|j| job_id(j.job.as_ref())).collect::<Vec<_>>(),
            "new_pipeline_id": r.new_pipeline_id,
            "new_run_attempt": r.new_run_attempt,
        }),
        Some(Body::RetryRefused(r)) => json!({
            "unit": r.target.as_ref().map(|t| t.unit.clone()),
            "reason": r.reason,
            "detail": r.detail,
            "jobs": r.jobs.iter().map(|j| job_id(j.job.as_ref())).collect::<Vec<_>>(),
        }),
        Some(Body::JobUnserved(u)) => json!({
            "job": job_id(u.job.as_ref()),
            "run_attempt": u.run_attempt,
            "project": u.project,
            "name": u.name,
            "labels": u.labels,
            "reason": u.reason,
            "detail": u.detail,
        }),
        Some(Body::ScaleSetProgress(p)) => json!({
            "pool": p.pool,
            "scale_set_id": p.scale_set_id,
            "session_id": p.session_id,
            "owner": p.owner,
            "last_message_id": p.last_message_id,
            "assigned_jobs": p.statistics.as_ref().map(|s| s.assigned_jobs),
        }),
        None => Value::Null,
    };
    json!({
        "id": event.id,
        "type": runyard_events::event_type(event),
        "occurred_at": time(event.occurred_at.as_ref()),
        "received_at": time(event.received_at.as_ref()),
        "source": source,
        "body": body,
    })
}

/// One line for people.
pub fn describe(event: &Event) -> String {
    let body = match &event.body {
        Some(Body::JobObserved(j)) => format!(
            "job {} {:?} status={:?} conclusion={:?} name={:?} labels={:?}",
            job_id(j.job.as_ref()),
            j.project,
            j.status(),
            j.conclusion(),
            j.name,
            j.labels
        ),
        Some(Body::PipelineObserved(p)) => format!(
            "pipeline {} {:?} status={} jobs={:?}",
            p.pipeline_id, p.project, p.status, p.job_ids
        ),
        Some(Body::UsageReported(u)) => format!(
            "usage job={} attempt={} peak={}B limit={:?} oom={} workload={:?}",
            job_id(u.job.as_ref()),
            u.attempt,
            u.peak_memory_bytes,
            u.memory_limit_bytes,
            u.oom_killed,
            u.workload
        ),
        Some(Body::AllocationIssued(a)) => format!(
            "allocation {} limit={}B request={}B cpu={}m retry={} basis={}",
            a.workload_key,
            a.memory_limit_bytes,
            a.memory_request_bytes,
            a.cpu_request_millicores,
            a.retry_count,
            a.statistic
        ),
        Some(
            b @ (Body::RunnerRequested(_)
            | Body::RunnerCreated(_)
            | Body::RunnerOnline(_)
            | Body::RunnerAssigned(_)
            | Body::RunnerFailed(_)
            | Body::RunnerDeleted(_)),
        ) => {
            let name = runyard_events::runner_ref(b).map_or("?", |r| r.name.as_str());
            let state = runyard_events::runner_state(b).unwrap_or("?");
            let detail = match b {
                Body::RunnerRequested(q) => format!(
                    " reason={} flavor={} job={}",
                    q.reason,
                    q.flavor,
                    job_id(q.job.as_ref())
                ),
                Body::RunnerCreated(c) => format!(" attempt={} status={}", c.attempt, c.status),
                Body::RunnerOnline(o) => format!(" source={}", o.source),
                Body::RunnerAssigned(a) => format!(" job={}", job_id(a.job.as_ref())),
                Body::RunnerFailed(f) => format!(
                    " reason={} attempt={} given_up={} error={:?}",
                    f.reason, f.attempt, f.given_up, f.error
                ),
                Body::RunnerDeleted(d) => format!(" reason={}", d.reason),
                _ => String::new(),
            };
            format!("runner {name} {state}{detail}")
        }
        Some(Body::RetryRequested(r)) => format!(
            "retry requested {} strategy={} jobs={}",
            r.target.as_ref().map_or("?", |t| t.unit.as_str()),
            r.strategy,
            r.jobs.len()
        ),
        Some(Body::RetryIssued(r)) => format!(
            "retry issued {} strategy={} new_pipeline={} new_attempt={}",
            r.target.as_ref().map_or("?", |t| t.unit.as_str()),
            r.strategy,
            r.new_pipeline_id,
            r.new_run_attempt
        ),
        Some(Body::RetryRefused(r)) => format!(
            "retry refused {} reason={} detail={:?}",
            r.target.as_ref().map_or("?", |t| t.unit.as_str()),
            r.reason,
            r.detail
        ),
        Some(Body::JobUnserved(u)) => format!(
            "job {} unserved reason={} labels={:?} detail={:?}",
            job_id(u.job.as_ref()),
            u.reason,
            u.labels,
            u.detail
        ),
        Some(Body::ScaleSetProgress(p)) => format!(
            "scale set {} of pool {} at message {} session={:?} owner={}",
            p.scale_set_id, p.pool, p.last_message_id, p.session_id, p.owner
        ),
        None => "empty".into(),
    };
    format!("{} {body}", event.id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_the_usual_units() {
        assert_eq!(parse_duration("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("30m"), Ok(Duration::from_secs(1800)));
        assert_eq!(parse_duration("2d"), Ok(Duration::from_secs(172_800)));
        assert!(parse_duration("2 days").is_err());
        assert!(parse_duration("h").is_err());
    }

    #[test]
    fn subjects_are_relative_to_the_namespace_unless_they_name_it() {
        let ns = Namespace::new("acme").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(subject_filter(&ns, false, "job.>"), "acme.v1.job.>");
        assert_eq!(subject_filter(&ns, true, "github"), "acme.raw.github");
        assert_eq!(
            subject_filter(&ns, false, "acme.v1.usage.>"),
            "acme.v1.usage.>"
        );
    }
}
