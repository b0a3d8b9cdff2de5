//! The consumer against a real nats-server with JetStream: ack only after the
//! handler's effect or the dead letter is durable, dead-lettering in the
//! batch and one-by-one paths, undecodable messages, progress acks, shutdown,
//! redelivery after a kill, ephemeral followers, metrics and spans.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_nats::jetstream::consumer::Info;
use async_nats::jetstream::stream::DiscardPolicy;
use bytes::Bytes;
use futures::StreamExt as _;
use prost::Message as _;
use runyard_bus::consumer::{
    BatchReport, Consumer, ConsumerConfig, ConsumerMetrics, Deliver, Delivery, Handler,
    HandlerError, ORIGINAL_SEQUENCE_HEADER, ORIGINAL_SUBJECT_HEADER, REASON_HEADER, Rejected,
};
use runyard_bus::{Bus, Outgoing, StreamSettings, TraceParent};
use runyard_events::{Event, Forge, JobStatus, Namespace};
use runyard_testkit::synth::{base_time, job_event, usage_event};
use runyard_testkit::{TestNats, eventually, stream_messages, unique_namespace};
use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;

/// Long enough for anything that should happen; tests finish as soon as it has.
const WAIT: Duration = Duration::from_secs(20);

struct Setup {
    nats: TestNats,
    ns: Namespace,
    bus: Bus,
}

async fn setup() -> Setup {
    runyard_telemetry::install_crypto_provider();
    let nats = TestNats::get().await;
    let ns = unique_namespace();
    let bus = Bus::connect(&nats.url(), ns.clone(), "consumer-test", false)
        .await
        .unwrap();
    bus.ensure_streams(&StreamSettings::default())
        .await
        .unwrap();
    Setup { nats, ns, bus }
}

/// Usage events for jobs `first..first + n`, published in order.
async fn publish_usage(bus: &Bus, first: u64, n: u64) -> Vec<Event> {
    let events: Vec<Event> = (first..first + n)
        .map(|j| usage_event(j, base_time()))
        .collect();
    let tp = TraceParent::new_root();
    for e in &events {
        bus.publish_event(e, &tp).await.unwrap();
    }
    events
}

async fn publish_raw(bus: &Bus, ns: &Namespace, id: &str, payload: Bytes) {
    bus.publish(Outgoing {
        subject: ns.job_subject(Forge::Github, JobStatus::Queued),
        id: id.into(),
        headers: vec![],
        payload,
    })
    .await
    .unwrap();
}

fn config(durable: &str) -> ConsumerConfig {
    ConsumerConfig {
        durable: Some(durable.into()),
        description: "consumer test".into(),
        batch_size: 100,
        batch_wait: Duration::from_millis(50),
        ack_wait: Duration::from_secs(2),
        max_attempts: 2,
        shutdown_grace: Duration::from_millis(500),
        span_name: "bus-test handle",
        ..ConsumerConfig::default()
    }
}

async fn info(bus: &Bus, name: &str) -> Info {
    let stream = bus
        .jetstream()
        .get_stream(bus.namespace().events_stream())
        .await
        .unwrap();
    stream.consumer_info(name).await.unwrap()
}

/// Waits until the consumer's ack floor reaches `seq` (acks are sent
/// without waiting for the server).
async fn acked_through(bus: &Bus, name: &str, seq: u64) -> Info {
    let got = eventually(WAIT, || async {
        let i = info(bus, name).await;
        (i.ack_floor.stream_sequence >= seq).then_some(i)
    })
    .await;
    got.unwrap_or_else(|| panic!("{name} acked through {seq}"))
}

async fn dead_letters(s: &Setup) -> Vec<async_nats::jetstream::Message> {
    let client = async_nats::connect(s.nats.url()).await.unwrap();
    stream_messages(&client, &s.ns.events_stream())
        .await
        .into_iter()
        .filter(|m| m.subject.as_str() == s.ns.deadletter_subject())
        .collect()
}

fn header<'a>(m: &'a async_nats::jetstream::Message, name: &str) -> &'a str {
    m.headers.as_ref().unwrap().get(name).unwrap().as_str()
}

fn seqs(batch: &[Delivery]) -> Vec<u64> {
    batch.iter().map(|d| d.seq).collect()
}

/// A handler answering each call with `answer(batch)`, recording the
/// sequences of every batch it was given.
struct Scripted<F> {
    calls: Mutex<Vec<Vec<u64>>>,
    answer: F,
}

impl<F> Scripted<F>
where
    F: Fn(&[Delivery]) -> Result<Rejected, HandlerError> + Send + Sync,
{
    fn new(answer: F) -> Self {
        Self {
            calls: Mutex::new(Vec::new()),
            answer,
        }
    }

    fn calls(&self) -> Vec<Vec<u64>> {
        self.calls.lock().unwrap().clone()
    }
}

impl<F> Handler for Scripted<F>
where
    F: Fn(&[Delivery]) -> Result<Rejected, HandlerError> + Send + Sync,
{
    async fn handle(&self, batch: &[Delivery]) -> Result<Rejected, HandlerError> {
        self.calls.lock().unwrap().push(seqs(batch));
        (self.answer)(batch)
    }
}

/// A handler that reports each call, then holds the batch until released.
struct Gated {
    called: mpsc::UnboundedSender<Vec<u64>>,
    release: Arc<Notify>,
}

impl Handler for Gated {
    async fn handle(&self, batch: &[Delivery]) -> Result<Rejected, HandlerError> {
        let _ = self.called.send(seqs(batch));
        self.release.notified().await;
        Ok(Vec::new())
    }
}

fn gated() -> (Gated, mpsc::UnboundedReceiver<Vec<u64>>, Arc<Notify>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let release = Arc::new(Notify::new());
    let h = Gated {
        called: tx,
        release: release.clone(),
    };
    (h, rx, release)
}

/// The next batch's report; fails the test if none is handled in time.
async fn next(c: &mut Consumer, h: &impl Handler) -> BatchReport {
    tokio::time::timeout(WAIT, c.process_next(h, WAIT))
        .await
        .expect("a batch handled in time")
        .unwrap()
        .expect("a batch")
}

/// Counts the progress acks (`+WPI`) sent for `consumer`'s messages.
async fn count_progress_acks(s: &Setup, consumer: &str) -> Arc<AtomicUsize> {
    let client = async_nats::connect(s.nats.url()).await.unwrap();
    let mut sub = client
        .subscribe(format!("$JS.ACK.{}.{consumer}.>", s.ns.events_stream()))
        .await
        .unwrap();
    client.flush().await.unwrap();
    let seen = Arc::new(AtomicUsize::new(0));
    let counter = seen.clone();
    tokio::spawn(async move {
        let _client = client;
        while let Some(m) = sub.next().await {
            if m.payload.as_ref() == b"+WPI" {
                counter.fetch_add(1, Ordering::SeqCst);
            }
        }
    });
    seen
}

#[tokio::test]
async fn a_batch_is_acked_only_after_the_handler_returns() {
    let s = setup().await;
    publish_usage(&s.bus, 1, 5).await;
    let mut c = Consumer::bind(&s.bus, config("ack-after"), None)
        .await
        .unwrap();
    assert!(c.status().is_ready());
    let (h, mut called, release) = gated();
    let task = tokio::spawn(async move {
        let r = next(&mut c, &h).await;
        (c, r)
    });
    assert_eq!(called.recv().await.unwrap(), vec![1, 2, 3, 4, 5]);
    let during = info(&s.bus, "ack-after").await;
    assert_eq!(during.num_ack_pending, 5, "nothing acked while handling");
    assert_eq!(during.ack_floor.stream_sequence, 0);

    release.notify_one();
    let (c, report) = task.await.unwrap();
    assert_eq!(report.handled, vec![1, 2, 3, 4, 5]);
    assert!(report.deadlettered.is_empty() && report.unacked.is_empty());
    let after = acked_through(&s.bus, "ack-after", 5).await;
    assert_eq!(after.num_ack_pending, 0);
    assert_eq!(c.status().last_acked(), 5);
}

#[tokio::test]
async fn rejected_events_are_dead_lettered_with_their_origin_then_acked() {
    let s = setup().await;
    publish_usage(&s.bus, 1, 3).await;
    let h = Scripted::new(|_: &[Delivery]| Ok(vec![(2, "cannot project\nthis".into())]));
    let mut c = Consumer::bind(&s.bus, config("rejects"), None)
        .await
        .unwrap();
    let report = next(&mut c, &h).await;
    assert_eq!(report.handled, vec![1, 3]);
    assert_eq!(
        report.deadlettered,
        vec![(2, "cannot project\nthis".to_owned())]
    );
    acked_through(&s.bus, "rejects", 3).await;

    let [dead] = dead_letters(&s).await.try_into().unwrap();
    assert_eq!(header(&dead, REASON_HEADER), "cannot project this");
    assert_eq!(
        header(&dead, ORIGINAL_SUBJECT_HEADER),
        s.ns.usage_subject(Forge::Github)
    );
    assert_eq!(header(&dead, ORIGINAL_SEQUENCE_HEADER), "2");
    assert_eq!(header(&dead, "Nats-Msg-Id"), "deadletter:2");
    let original = s
        .bus
        .jetstream()
        .get_stream(s.ns.events_stream())
        .await
        .unwrap()
        .get_raw_message(2)
        .await
        .unwrap();
    assert_eq!(dead.payload, original.payload, "the original bytes");

    // The dead letter itself (sequence 4) is acked and never handled.
    let report = next(&mut c, &h).await;
    assert_eq!(report.skipped, vec![4]);
    assert!(report.handled.is_empty());
    assert_eq!(h.calls(), vec![vec![1, 2, 3]]);
    acked_through(&s.bus, "rejects", 4).await;
}

#[tokio::test]
async fn a_permanent_failure_splits_the_batch_so_only_culprits_are_dead_lettered() {
    let s = setup().await;
    publish_usage(&s.bus, 1, 4).await;
    // Sequence 2 breaks any batch it is in; sequence 3 is fine in a batch
    // but rejected on its own (the one-by-one path must dead-letter it too).
    let h = Scripted::new(|batch: &[Delivery]| {
        if batch.iter().any(|d| d.seq == 2) {
            Err(HandlerError::Permanent("constraint violated".into()))
        } else if seqs(batch) == [3] {
            Ok(vec![(3, "unprojectable".into())])
        } else {
            Ok(Vec::new())
        }
    });
    let mut c = Consumer::bind(&s.bus, config("split"), None).await.unwrap();
    let report = next(&mut c, &h).await;
    assert_eq!(
        h.calls(),
        vec![vec![1, 2, 3, 4], vec![1], vec![2], vec![3], vec![4]]
    );
    assert_eq!(report.handled, vec![1, 4]);
    assert_eq!(
        report.deadlettered,
        vec![
            (2, "constraint violated".to_owned()),
            (3, "unprojectable".to_owned())
        ]
    );
    acked_through(&s.bus, "split", 4).await;
    let dead = dead_letters(&s).await;
    let origins: Vec<&str> = dead
        .iter()
        .map(|m| header(m, ORIGINAL_SEQUENCE_HEADER))
        .collect();
    assert_eq!(origins, ["2", "3"]);
}

#[tokio::test]
async fn undecodable_messages_come_back_then_are_dead_lettered() {
    let s = setup().await;
    let junk = Bytes::from_static(b"\xff\xff not protobuf");
    publish_raw(&s.bus, &s.ns, "junk-1", junk.clone()).await;
    let no_id = Bytes::from(
        Event {
            id: String::new(),
            ..usage_event(1, base_time())
        }
        .encode_to_vec(),
    );
    publish_raw(&s.bus, &s.ns, "junk-2", no_id.clone()).await;
    let h = Scripted::new(|_: &[Delivery]| Ok(Vec::new()));
    let mut c = Consumer::bind(&s.bus, config("poison"), None)
        .await
        .unwrap();

    // First delivery of each: back for another try (max_attempts = 2).
    let report = next(&mut c, &h).await;
    assert_eq!(report.retried, vec![1, 2]);
    assert_eq!(info(&s.bus, "poison").await.ack_floor.stream_sequence, 0);
    // Second delivery: dead-lettered, then acked.
    let mut dead = Vec::new();
    while dead.len() < 2 {
        let report = next(&mut c, &h).await;
        assert!(report.retried.is_empty(), "{report:?}");
        dead.extend(report.deadlettered);
    }
    assert_eq!(dead[0].0, 1);
    assert!(dead[0].1.starts_with("undecodable event"), "{dead:?}");
    assert_eq!(dead[1], (2, "event without id".to_owned()));
    assert!(h.calls().is_empty(), "the handler never sees them");
    acked_through(&s.bus, "poison", 2).await;
    let letters = dead_letters(&s).await;
    assert_eq!(letters.len(), 2);
    assert_eq!(letters[0].payload, junk);
    assert_eq!(letters[1].payload, no_id);
}

#[tokio::test]
async fn a_dead_letter_that_cannot_be_stored_leaves_the_message_unacked() {
    let s = setup().await;
    publish_usage(&s.bus, 1, 1).await;
    // A full stream that refuses new messages: the dead letter cannot land.
    let js = s.bus.jetstream();
    let mut stream = js.get_stream(s.ns.events_stream()).await.unwrap();
    let open = stream.info().await.unwrap().config.clone();
    js.update_stream(async_nats::jetstream::stream::Config {
        max_messages: 1,
        discard: DiscardPolicy::New,
        ..open.clone()
    })
    .await
    .unwrap();

    let (tx, mut called) = mpsc::unbounded_channel();
    let h = Scripted::new(move |batch: &[Delivery]| {
        let _ = tx.send(seqs(batch));
        Ok(vec![(1, "unprojectable".into())])
    });
    let h = Arc::new(h);
    let shutdown = CancellationToken::new();
    let mut c = Consumer::bind(&s.bus, config("full"), None)
        .await
        .unwrap()
        .with_shutdown(shutdown.clone());
    let task = {
        let h = h.clone();
        tokio::spawn(async move { next(&mut c, h.as_ref()).await })
    };
    assert_eq!(called.recv().await.unwrap(), vec![1]);
    // Retrying the dead letter while it is held; shutdown ends that after
    // the grace period, without an ack.
    shutdown.cancel();
    let report = tokio::time::timeout(WAIT, task).await.unwrap().unwrap();
    assert!(report.deadlettered.is_empty(), "{report:?}");
    assert_eq!(report.unacked, vec![1]);
    assert!(report.handled.is_empty());
    assert_eq!(info(&s.bus, "full").await.ack_floor.stream_sequence, 0);
    assert!(dead_letters(&s).await.is_empty());

    // Room again: the message comes back, and this time its dead letter is
    // stored and it is acked.
    js.update_stream(open).await.unwrap();
    let mut c = Consumer::bind(&s.bus, config("full"), None).await.unwrap();
    let report = next(&mut c, h.as_ref()).await;
    assert_eq!(report.deadlettered, vec![(1, "unprojectable".to_owned())]);
    acked_through(&s.bus, "full", 1).await;
    assert_eq!(dead_letters(&s).await.len(), 1);
}

#[tokio::test]
async fn transient_failures_retry_the_batch_kept_with_progress_acks() {
    let s = setup().await;
    publish_usage(&s.bus, 1, 3).await;
    let mut cfg = config("transient");
    cfg.ack_wait = Duration::from_secs(1);
    let registry = runyard_telemetry::Metrics::new();
    let metrics = ConsumerMetrics::register(&registry, "bus_test");
    let progress = count_progress_acks(&s, "transient").await;
    // The database is "down" until the batch has been kept past its ack
    // wait by progress acks.
    let seen = progress.clone();
    // What the stalled gauge said at each retry.
    let gauge = metrics.clone();
    let stalled_at_retries = Arc::new(std::sync::Mutex::new(Vec::new()));
    let stalled = stalled_at_retries.clone();
    let first = std::sync::atomic::AtomicBool::new(true);
    let h = Scripted::new(move |_: &[Delivery]| {
        if !first.swap(false, Ordering::SeqCst) {
            stalled.lock().unwrap().push(gauge.stalled.get());
        }
        if seen.load(Ordering::SeqCst) < 3 * 3 {
            Err(HandlerError::Transient("connection refused".into()))
        } else {
            Ok(Vec::new())
        }
    });
    let mut c = Consumer::bind(&s.bus, cfg, Some(metrics.clone()))
        .await
        .unwrap();
    assert!(!c.status().is_stalled());
    let report = next(&mut c, &h).await;
    assert_eq!(report.handled, vec![1, 2, 3]);
    assert!(h.calls().len() > 1, "retried");
    let stalled = stalled_at_retries.lock().unwrap().clone();
    assert!(
        !stalled.is_empty() && stalled.iter().all(|g| *g == 1),
        "stalled through every retry: {stalled:?}"
    );
    assert_eq!(metrics.stalled.get(), 0, "no longer stalled once applied");
    assert!(!c.status().is_stalled());
    assert!(h.calls().iter().all(|b| b == &[1, 2, 3]), "as one batch");
    assert_eq!(metrics.apply_failures.get(), h.calls().len() as u64 - 1);
    let i = acked_through(&s.bus, "transient", 3).await;
    assert_eq!(
        i.num_redelivered, 0,
        "held past ack_wait, never redelivered"
    );
    assert_eq!(i.delivered.consumer_sequence, 3);
}

#[tokio::test]
async fn a_slow_batch_is_kept_with_progress_acks() {
    let s = setup().await;
    publish_usage(&s.bus, 1, 2).await;
    let mut cfg = config("slow");
    cfg.ack_wait = Duration::from_secs(1);
    let progress = count_progress_acks(&s, "slow").await;
    let (h, mut called, release) = gated();
    let mut c = Consumer::bind(&s.bus, cfg, None).await.unwrap();
    let task = tokio::spawn(async move {
        let r = next(&mut c, &h).await;
        (c, r)
    });
    assert_eq!(called.recv().await.unwrap(), vec![1, 2]);
    // Held for more than the ack wait: three rounds of progress acks.
    let kept = eventually(WAIT, || async {
        (progress.load(Ordering::SeqCst) >= 3 * 2).then_some(())
    })
    .await;
    assert!(kept.is_some(), "progress acks sent while handling");
    release.notify_one();
    let (_c, report) = task.await.unwrap();
    assert_eq!(report.handled, vec![1, 2]);
    assert!(called.try_recv().is_err(), "handled once");
    let i = acked_through(&s.bus, "slow", 2).await;
    assert_eq!(i.num_redelivered, 0);
}

#[tokio::test]
async fn a_killed_consumer_s_batch_comes_back_within_the_ack_wait() {
    let s = setup().await;
    publish_usage(&s.bus, 1, 3).await;
    let (h, mut called, _release) = gated();
    let mut c = Consumer::bind(&s.bus, config("killed"), None)
        .await
        .unwrap();
    let task = tokio::spawn(async move { next(&mut c, &h).await });
    assert_eq!(called.recv().await.unwrap(), vec![1, 2, 3]);
    // Gone mid-batch, as with kill -9: no ack, no nak, no progress.
    task.abort();
    let killed_at = std::time::Instant::now();

    let h = Scripted::new(|_: &[Delivery]| Ok(Vec::new()));
    let mut successor = Consumer::bind(&s.bus, config("killed"), None)
        .await
        .unwrap();
    let mut handled = Vec::new();
    while handled.len() < 3 {
        handled.extend(next(&mut successor, &h).await.handled);
    }
    assert_eq!(handled, vec![1, 2, 3]);
    assert!(
        killed_at.elapsed() < Duration::from_secs(2 + 3),
        "back within ack_wait (2 s), not 30 s: {:?}",
        killed_at.elapsed()
    );
    acked_through(&s.bus, "killed", 3).await;
}

#[tokio::test]
async fn shutdown_finishes_and_acks_the_batch_in_hand() {
    let s = setup().await;
    publish_usage(&s.bus, 1, 3).await;
    let (h, mut called, release) = gated();
    let c = Consumer::new(&s.bus, config("finish"), None);
    let status = c.status();
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(c.run(h, shutdown.clone()));
    assert_eq!(called.recv().await.unwrap(), vec![1, 2, 3]);
    assert!(status.is_ready());
    shutdown.cancel();
    release.notify_one();
    tokio::time::timeout(WAIT, run).await.unwrap().unwrap();
    assert!(!status.is_ready());
    assert_eq!(status.last_acked(), 3);
    acked_through(&s.bus, "finish", 3).await;
}

#[tokio::test]
async fn shutdown_gives_up_a_failing_batch_after_the_grace_period_unacked() {
    let s = setup().await;
    publish_usage(&s.bus, 1, 2).await;
    let (tx, mut called) = mpsc::unbounded_channel();
    let h = Scripted::new(move |batch: &[Delivery]| {
        let _ = tx.send(seqs(batch));
        Err(HandlerError::Transient("database is shutting down".into()))
    });
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(Consumer::new(&s.bus, config("give-up"), None).run(h, shutdown.clone()));
    called.recv().await.unwrap();
    let asked = std::time::Instant::now();
    shutdown.cancel();
    tokio::time::timeout(WAIT, run).await.unwrap().unwrap();
    // Bounded: the grace period (0.5 s) plus one attempt, not forever.
    assert!(
        asked.elapsed() < Duration::from_secs(5),
        "{:?}",
        asked.elapsed()
    );
    let i = info(&s.bus, "give-up").await;
    assert_eq!(i.ack_floor.stream_sequence, 0, "nothing acked");

    // Redelivered to whoever comes next.
    let h = Scripted::new(|_: &[Delivery]| Ok(Vec::new()));
    let mut c = Consumer::bind(&s.bus, config("give-up"), None)
        .await
        .unwrap();
    assert_eq!(next(&mut c, &h).await.handled, vec![1, 2]);
}

#[tokio::test]
async fn ephemeral_followers_start_where_told_and_resume_after_what_they_acked() {
    let s = setup().await;
    publish_usage(&s.bus, 1, 3).await;
    s.bus
        .publish_event(
            &job_event(9, JobStatus::Queued, base_time()),
            &TraceParent::new_root(),
        )
        .await
        .unwrap();
    let stream = s
        .bus
        .jetstream()
        .get_stream(s.ns.events_stream())
        .await
        .unwrap();
    let third = stream.get_raw_message(3).await.unwrap().time;
    publish_usage(&s.bus, 5, 2).await; // sequences 5 and 6

    let usage = format!("{}.v1.usage.>", s.ns);
    let follower = |deliver, filters: Vec<String>| ConsumerConfig {
        durable: None,
        filter_subjects: filters,
        deliver,
        ..config("unused")
    };
    let h = Scripted::new(|_: &[Delivery]| Ok(Vec::new()));

    // By start time, one filter: what came after the third message.
    let after = third + time::Duration::nanoseconds(1);
    let mut c = Consumer::bind(
        &s.bus,
        follower(Deliver::ByStartTime(after), vec![usage.clone()]),
        None,
    )
    .await
    .unwrap();
    assert_eq!(next(&mut c, &h).await.handled, vec![5, 6]);

    // By start sequence, two filters.
    let job = format!("{}.v1.job.>", s.ns);
    let mut both = Consumer::bind(
        &s.bus,
        follower(Deliver::ByStartSequence(2), vec![usage.clone(), job]),
        None,
    )
    .await
    .unwrap();
    let mut got = Vec::new();
    while got.len() < 5 {
        got.extend(next(&mut both, &h).await.handled);
    }
    assert_eq!(got, vec![2, 3, 4, 5, 6]);

    // New: only what is published after binding.
    let mut new = Consumer::bind(&s.bus, follower(Deliver::New, vec![usage.clone()]), None)
        .await
        .unwrap();
    publish_usage(&s.bus, 7, 1).await; // sequence 7
    assert_eq!(next(&mut new, &h).await.handled, vec![7]);

    // The first follower's consumer disappears (server restart, expiry):
    // bound again, it carries on after what it acked, not from its start.
    let name = c.name().unwrap().to_owned();
    stream.delete_consumer(&name).await.unwrap();
    publish_usage(&s.bus, 8, 1).await; // sequence 8
    let mut resumed = Vec::new();
    let deadline = std::time::Instant::now() + WAIT;
    while !resumed.contains(&8) && std::time::Instant::now() < deadline {
        // The first call may report the lost binding; the next binds again.
        if let Ok(Some(r)) = c.process_next(&h, WAIT).await {
            resumed.extend(r.handled);
        }
    }
    assert_eq!(resumed, vec![7, 8]);
    assert_ne!(c.name(), Some(name.as_str()));
}

#[tokio::test]
async fn a_lost_durable_is_bound_again_and_its_status_follows() {
    let s = setup().await;
    publish_usage(&s.bus, 1, 2).await;
    let (tx, mut handled) = mpsc::unbounded_channel();
    let h = Scripted::new(move |batch: &[Delivery]| {
        for d in batch {
            let _ = tx.send(d.seq);
        }
        Ok(Vec::new())
    });
    let c = Consumer::new(&s.bus, config("lost"), None);
    let status = c.status();
    let mut ready = status.ready_changes();
    assert!(!*ready.borrow_and_update());
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(c.run(h, shutdown.clone()));
    assert_eq!(
        (handled.recv().await, handled.recv().await),
        (Some(1), Some(2))
    );
    assert!(status.is_ready());

    s.bus
        .jetstream()
        .get_stream(s.ns.events_stream())
        .await
        .unwrap()
        .delete_consumer("lost")
        .await
        .unwrap();
    publish_usage(&s.bus, 3, 1).await;
    // Created again (from the start: a durable's handler is idempotent), it
    // gets the new message too.
    let got = tokio::time::timeout(WAIT, async {
        while let Some(seq) = handled.recv().await {
            if seq == 3 {
                return;
            }
        }
    })
    .await;
    assert!(
        got.is_ok(),
        "the new message was handled after binding again"
    );
    assert!(status.is_ready());
    shutdown.cancel();
    run.await.unwrap();
    assert!(!status.is_ready());
}

#[tokio::test]
async fn metrics_count_dead_letters_and_lag_reaches_zero() {
    let s = setup().await;
    publish_usage(&s.bus, 1, 3).await;
    let registry = runyard_telemetry::Metrics::new();
    let metrics = ConsumerMetrics::register(&registry, "bus_test");
    let h = Scripted::new(|_: &[Delivery]| Ok(vec![(1, "no".into())]));
    let mut c = Consumer::bind(&s.bus, config("metrics"), Some(metrics))
        .await
        .unwrap();
    next(&mut c, &h).await;
    // The dead letter is sequence 4, not yet seen.
    assert_eq!(c.refresh_lag().await.unwrap(), 1);
    assert_eq!(next(&mut c, &h).await.skipped, vec![4]);
    assert_eq!(c.refresh_lag().await.unwrap(), 0);
    let text = registry.encode();
    for want in [
        r#"runyard_bus_test_events_total{result="deadlettered"} 1"#,
        "runyard_bus_test_batch_size_count 1",
        "runyard_bus_test_last_applied_sequence 4",
        "runyard_bus_test_consumer_lag 0",
        "runyard_bus_test_apply_latency_seconds_count 1",
        "runyard_bus_test_apply_failures_total 0",
    ] {
        assert!(text.contains(want), "{want} in {text}");
    }
}

#[tokio::test]
async fn each_event_is_a_span_of_the_trace_it_carries() {
    use runyard_testkit::otlp::{AnyValue, Collector, attribute, hex_id};

    let collector = Collector::start().await;
    runyard_telemetry::traces::install("bus-test", &collector.url).unwrap();
    let s = setup().await;
    let sender = TraceParent::new_root();
    let events: Vec<Event> = (1..=2).map(|j| usage_event(j, base_time())).collect();
    for e in &events {
        s.bus.publish_event(e, &sender).await.unwrap();
    }
    let h = Scripted::new(|_: &[Delivery]| Ok(vec![(2, "unprojectable".into())]));
    let mut c = Consumer::bind(&s.bus, config("spans"), None).await.unwrap();
    let report = next(&mut c, &h).await;
    assert_eq!(report.handled, vec![1]);

    let trace = format!("{:032x}", sender.trace_id);
    let ours =
        |spans: &[(String, runyard_testkit::otlp::Span)]| -> Vec<runyard_testkit::otlp::Span> {
            spans
                .iter()
                .map(|(_, s)| s)
                .filter(|s| s.name == "bus-test handle" && hex_id(&s.trace_id) == trace)
                .cloned()
                .collect()
        };
    let spans = collector
        .wait_for(WAIT, |spans| ours(spans).len() == 2)
        .await
        .expect("one span per event");
    let mut spans = ours(&spans);
    spans.sort_by_key(|s| match attribute(s, "runyard.stream_sequence") {
        Some(AnyValue::IntValue(v)) => v,
        _ => 0,
    });
    for (span, event) in spans.iter().zip(&events) {
        assert_eq!(
            hex_id(&span.parent_span_id),
            format!("{:016x}", sender.span_id)
        );
        assert_eq!(
            attribute(span, "runyard.event_id"),
            Some(AnyValue::StringValue(event.id.clone()))
        );
        assert_eq!(
            attribute(span, "runyard.event_type"),
            Some(AnyValue::StringValue("UsageReported".into()))
        );
    }
    let status = |s: &runyard_testkit::otlp::Span| s.status.clone().unwrap_or_default();
    assert_eq!(status(&spans[0]).code, 1, "applied: OK");
    assert_eq!(status(&spans[1]).code, 2, "rejected: error");
    assert_eq!(status(&spans[1]).message, "unprojectable");
}
