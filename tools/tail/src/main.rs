//! `runyard-tail`: prints what the event log holds, one line per event, and
//! optionally follows it. A debugging aid and the quick start's window into
//! the log.

use std::io::Write as _;

use anyhow::Context as _;
use async_nats::jetstream::{self, consumer};
use clap::Parser;
use futures::StreamExt as _;
use prost::Message as _;
use runyard_events::{Event, Namespace};

/// Prints the events of a runyard namespace.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// NATS server.
    #[arg(
        long,
        env = "RUNYARD_NATS_URL",
        default_value = "nats://127.0.0.1:4222"
    )]
    nats_url: String,
    /// Namespace (stream `<NS>_EVENTS`).
    #[arg(long, env = "RUNYARD_NAMESPACE", default_value = "runyard")]
    namespace: String,
    /// Keep following new events instead of stopping at the end.
    #[arg(long, short)]
    follow: bool,
    /// Show the raw-delivery stream instead (headers and body size).
    #[arg(long)]
    raw: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    runyard_telemetry::install_crypto_provider();
    let args = Args::parse();
    let ns = Namespace::new(args.namespace)?;
    let client = async_nats::connect(&args.nats_url)
        .await
        .with_context(|| format!("connecting to {}", args.nats_url))?;
    let js = jetstream::new(client);
    let name = if args.raw {
        ns.raw_stream()
    } else {
        ns.events_stream()
    };
    let mut stream = js
        .get_stream(&name)
        .await
        .with_context(|| format!("stream {name}"))?;
    let last = stream.info().await?.state.last_sequence;
    if last == 0 && !args.follow {
        return Ok(());
    }
    // An ordered consumer, not `runyard_bus::consumer`: tail only reads.
    // The bus consumer acks (moving a durable's position or holding an
    // ephemeral's acks), sends undecodable messages back and finally
    // dead-letters them — a publish into the very log being inspected —
    // and only decodes events, while tail prints undecodable messages as
    // they are and also reads the raw-delivery stream. An ordered consumer
    // has no acks and leaves nothing behind on the server.
    let consumer = stream
        .create_consumer(consumer::pull::OrderedConfig {
            deliver_policy: consumer::DeliverPolicy::All,
            ..Default::default()
        })
        .await?;
    let mut messages = consumer.messages().await?;
    let mut out = std::io::stdout().lock();
    while let Some(msg) = messages.next().await {
        let msg = msg?;
        let seq = msg.info().map(|i| i.stream_sequence).unwrap_or_default();
        if args.raw {
            let headers = msg
                .headers
                .as_ref()
                .map(|h| format!("{h:?}"))
                .unwrap_or_default();
            writeln!(
                out,
                "#{seq} {} {} bytes {headers}",
                msg.subject,
                msg.payload.len()
            )?;
        } else {
            match Event::decode(msg.payload.clone()) {
                Ok(event) => writeln!(out, "#{seq} {} {}", msg.subject, describe(&event))?,
                Err(e) => writeln!(out, "#{seq} {} undecodable: {e}", msg.subject)?,
            }
        }
        if !args.follow && seq >= last {
            break;
        }
    }
    Ok(())
}

fn describe(event: &Event) -> String {
    use runyard_events::Body;
    let body = match &event.body {
        Some(Body::JobObserved(j)) => format!(
            "job {} {:?} status={:?} conclusion={:?} name={:?} labels={:?}",
            j.job.as_ref().map(|k| k.job_id).unwrap_or_default(),
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
            u.job.as_ref().map(|k| k.job_id).unwrap_or_default(),
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
                    q.job.as_ref().map(|k| k.job_id).unwrap_or_default()
                ),
                Body::RunnerCreated(c) => format!(" attempt={} status={}", c.attempt, c.status),
                Body::RunnerOnline(o) => format!(" source={}", o.source),
                Body::RunnerAssigned(a) => format!(
                    " job={}",
                    a.job.as_ref().map(|k| k.job_id).unwrap_or_default()
                ),
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
        None => "empty".into(),
    };
    format!("{} {body}", event.id)
}
