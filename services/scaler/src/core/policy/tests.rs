//! Given a world, when the policy runs at some time, then these decisions.

use std::collections::BTreeMap;

use super::*;

const S: Duration = Duration::from_secs(1);
const T0: Duration = Duration::from_secs(1_000_000);

fn pool(name: &str, labels: &[&str], max: u32, min_idle: u32) -> PoolSpec {
    PoolSpec {
        name: name.into(),
        forge: Forge::Github,
        instance: "github.com".into(),
        labels: labels.iter().map(|l| l.to_ascii_lowercase()).collect(),
        min_idle,
        max_runners: max,
        idle_timeout: 300 * S,
        bootstrap_timeout: 600 * S,
        priority: 0,
        repos: None,
        scale_set: false,
    }
}

fn knobs() -> Knobs {
    Knobs {
        idle_backoff: 10 * S,
        create_attempts: 5,
        balance: Balance::Spread,
    }
}

fn jid(n: u64) -> JobId {
    JobId {
        forge: Forge::Github,
        instance: "github.com".into(),
        job_id: n,
    }
}

fn job(world: &mut World, n: u64, labels: &[&str], queued_at: Clock) {
    world.jobs.insert(
        jid(n),
        Job {
            id: jid(n),
            run_attempt: 1,
            pipeline_id: 0,
            labels: Some(labels.iter().map(|l| l.to_ascii_lowercase()).collect()),
            status: JobStatus::Queued,
            seen: (runyard_events::Stage::Pending, queued_at),
            cancelled: false,
            queued_at,
            project: "acme/app".into(),
            project_id: 1,
            workflow: "ci".into(),
            name: format!("job {n}"),
            git_ref: "main".into(),
            runner_name: None,
            given_up: false,
            scale_set: None,
            forge_status: String::new(),
        },
    );
}

fn runner(world: &mut World, name: &str, pool: &str, job: Option<u64>, phase: Phase, at: Clock) {
    let mut r = Runner::requested(name, pool, job.map(jid), 1, "", at);
    r.phase = phase;
    r.idle_since = (phase == Phase::Online).then_some(at);
    r.flavor = "small".into();
    world.runners.insert(name.into(), r);
}

fn run(pools: &[PoolSpec], world: &World, now: Clock) -> Vec<Decision> {
    decide(pools, world, &|_| true, &|_| false, now, &knobs())
}

fn creates(d: &[Decision]) -> Vec<u64> {
    d.iter()
        .filter_map(|d| match d {
            Decision::Create { job, .. } => Some(job.job_id),
            _ => None,
        })
        .collect()
}

#[test]
fn a_queued_job_without_an_idle_runner_gets_one_at_once() {
    let pools = [pool("linux", &["self-hosted", "linux"], 10, 0)];
    let mut w = World::default();
    job(&mut w, 1, &["self-hosted", "Linux"], T0);
    assert_eq!(creates(&run(&pools, &w, T0)), vec![1]);
}

#[test]
fn labels_must_be_a_subset_of_the_pools() {
    let pools = [pool("linux", &["self-hosted", "linux"], 10, 0)];
    let mut w = World::default();
    job(&mut w, 1, &["self-hosted", "linux", "gpu"], T0);
    job(&mut w, 2, &[], T0);
    assert!(run(&pools, &w, T0).is_empty());
}

#[test]
fn priority_wins_then_ties_are_spread_by_job() {
    let mut hi = pool("hi", &["linux"], 10, 0);
    hi.priority = 5;
    let pools = [pool("a", &["linux"], 10, 0), pool("b", &["linux"], 10, 0)];
    let mut w = World::default();
    for n in 1..=4 {
        job(&mut w, n, &["linux"], T0);
    }
    let chosen: Vec<String> = (1..=4)
        .map(|n| {
            choose_pool(&pools, &w.jobs[&jid(n)], Balance::Spread)
                .map(|p| p.name.clone())
                .unwrap_or_default()
        })
        .collect();
    assert_eq!(chosen, ["b", "a", "b", "a"]);
    let with_hi = [pools[0].clone(), hi, pools[1].clone()];
    assert_eq!(
        choose_pool(&with_hi, &w.jobs[&jid(1)], Balance::Spread).map(|p| p.name.as_str()),
        Some("hi")
    );
}

/// Creates per pool.
fn creates_by_pool(d: &[Decision]) -> BTreeMap<String, Vec<u64>> {
    let mut out: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for d in d {
        if let Decision::Create { pool, job, .. } = d {
            out.entry(pool.clone()).or_default().push(job.job_id);
        }
    }
    out
}

#[test]
fn a_job_spills_over_to_the_next_priority_when_the_top_pool_is_full() {
    let mut hi = pool("hi", &["linux"], 2, 0);
    hi.priority = 5;
    let pools = [hi, pool("lo", &["linux"], 10, 0)];
    let mut w = World::default();
    for n in 1..=5 {
        job(&mut w, n, &["linux"], T0 + n as u32 * S);
    }
    let by_pool = creates_by_pool(&run(&pools, &w, T0 + 10 * S));
    assert_eq!(by_pool["hi"], [1, 2], "the oldest fill the top pool");
    assert_eq!(by_pool["lo"], [3, 4, 5], "the rest spill over");

    // Once the top pool has runners for its two, they count: a new job
    // spills over too, and the jobs made for `lo` stay there.
    runner(&mut w, "h1", "hi", Some(1), Phase::Created, T0);
    runner(&mut w, "h2", "hi", Some(2), Phase::Created, T0);
    for (name, n) in [("l3", 3), ("l4", 4), ("l5", 5)] {
        runner(&mut w, name, "lo", Some(n), Phase::Created, T0);
    }
    job(&mut w, 6, &["linux"], T0 + 20 * S);
    let by_pool = creates_by_pool(&run(&pools, &w, T0 + 21 * S));
    assert_eq!(by_pool.get("hi"), None);
    assert_eq!(by_pool["lo"], [6]);
    // `hi` frees a place: the next job takes it; `lo`'s claimed jobs stay.
    runner(&mut w, "l6", "lo", Some(6), Phase::Created, T0);
    w.runners.remove("h1");
    w.jobs.remove(&jid(1));
    job(&mut w, 7, &["linux"], T0 + 30 * S);
    let by_pool = creates_by_pool(&run(&pools, &w, T0 + 31 * S));
    assert_eq!(by_pool["hi"], [7]);
    let status = status(&pools, &w, Balance::Spread);
    assert_eq!((status[0].queued, status[1].queued), (2, 4));
}

#[test]
fn pack_fills_tied_pools_in_name_order_and_spread_takes_turns() {
    let pools = [pool("b", &["linux"], 3, 0), pool("a", &["linux"], 3, 0)];
    let mut w = World::default();
    for n in 1..=4 {
        job(&mut w, n, &["linux"], T0 + n as u32 * S);
    }
    let with = |balance| {
        let k = Knobs { balance, ..knobs() };
        creates_by_pool(&decide(&pools, &w, &|_| true, &|_| false, T0 + 9 * S, &k))
    };
    let pack = with(Balance::Pack);
    assert_eq!((pack["a"].len(), pack["b"].len()), (3, 1));
    let spread = with(Balance::Spread);
    assert_eq!((spread["a"].len(), spread["b"].len()), (2, 2));
    // Every replica decides the same: the order the pools are listed in
    // changes nothing.
    let reversed = [pools[1].clone(), pools[0].clone()];
    let k = Knobs {
        balance: Balance::Pack,
        ..knobs()
    };
    assert_eq!(
        creates_by_pool(&decide(
            &reversed,
            &w,
            &|_| true,
            &|_| false,
            T0 + 9 * S,
            &k
        )),
        pack
    );
}

#[test]
fn a_full_pool_with_no_other_match_keeps_its_jobs_waiting() {
    let pools = [pool("only", &["linux"], 1, 0), pool("gpu", &["gpu"], 10, 0)];
    let mut w = World::default();
    job(&mut w, 1, &["linux"], T0);
    job(&mut w, 2, &["linux"], T0 + S);
    assert_eq!(creates_by_pool(&run(&pools, &w, T0 + 2 * S))["only"], [1]);
    assert_eq!(status(&pools, &w, Balance::Spread)[0].queued, 2);
}

#[test]
fn an_idle_runner_gets_the_back_off_first() {
    let pools = [pool("linux", &["linux"], 10, 0)];
    let mut w = World::default();
    runner(&mut w, "idle", "linux", None, Phase::Online, T0);
    job(&mut w, 1, &["linux"], T0 + S);
    assert!(
        creates(&run(&pools, &w, T0 + 2 * S)).is_empty(),
        "waits for the idle runner"
    );
    assert_eq!(
        creates(&run(&pools, &w, T0 + 11 * S)),
        vec![1],
        "then creates anyway"
    );
    // A second job has no idle runner left to wait for.
    job(&mut w, 2, &["linux"], T0 + 2 * S);
    assert_eq!(creates(&run(&pools, &w, T0 + 3 * S)), vec![2]);
}

#[test]
fn a_booting_idle_runner_does_not_delay_a_job() {
    let pools = [pool("linux", &["linux"], 10, 1)];
    let mut w = World::default();
    runner(&mut w, "warm", "linux", None, Phase::Created, T0);
    job(&mut w, 1, &["linux"], T0);
    let d = run(&pools, &w, T0 + S);
    assert_eq!(creates(&d), vec![1]);
    assert!(
        !d.iter().any(|d| matches!(d, Decision::CreateIdle { .. })),
        "{d:?}"
    );
}

#[test]
fn one_runner_per_job_and_never_above_max_oldest_first() {
    let pools = [pool("linux", &["linux"], 3, 0)];
    let mut w = World::default();
    for n in 1..=5 {
        job(
            &mut w,
            n,
            &["linux"],
            T0 + S * u32::try_from(n).unwrap_or(0),
        );
    }
    runner(&mut w, "r1", "linux", Some(1), Phase::Requested, T0);
    assert_eq!(creates(&run(&pools, &w, T0 + 10 * S)), vec![2, 3]);
    runner(&mut w, "r2", "linux", Some(2), Phase::Created, T0);
    runner(&mut w, "r3", "linux", Some(3), Phase::Created, T0);
    assert!(
        creates(&run(&pools, &w, T0 + 10 * S)).is_empty(),
        "at max: jobs wait"
    );
    // Capacity frees as a runner goes: the oldest waiting job is next.
    if let Some(j) = w.jobs.get_mut(&jid(1)) {
        j.status = JobStatus::Completed;
    }
    if let Some(r) = w.runners.get_mut("r1") {
        r.phase = Phase::Deleted;
    }
    assert_eq!(creates(&run(&pools, &w, T0 + 10 * S)), vec![4]);
}

#[test]
fn finished_and_started_jobs_get_no_runner() {
    let pools = [pool("linux", &["linux"], 3, 0)];
    let mut w = World::default();
    job(&mut w, 1, &["linux"], T0);
    job(&mut w, 2, &["linux"], T0);
    if let Some(j) = w.jobs.get_mut(&jid(1)) {
        j.status = JobStatus::InProgress;
    }
    if let Some(j) = w.jobs.get_mut(&jid(2)) {
        j.status = JobStatus::Completed;
    }
    assert!(run(&pools, &w, T0).is_empty());
}

#[test]
fn min_idle_is_kept_and_booting_runners_count() {
    let pools = [pool("linux", &["linux"], 5, 2)];
    let mut w = World::default();
    let d = run(&pools, &w, T0);
    assert_eq!(
        d.iter()
            .filter(|d| matches!(d, Decision::CreateIdle { .. }))
            .count(),
        2
    );
    runner(&mut w, "w1", "linux", None, Phase::Requested, T0);
    runner(&mut w, "w2", "linux", None, Phase::Online, T0);
    assert!(run(&pools, &w, T0 + S).is_empty());
}

#[test]
fn min_idle_never_breaks_max() {
    let pools = [pool("linux", &["linux"], 2, 2)];
    let mut w = World::default();
    runner(&mut w, "b1", "linux", Some(1), Phase::Assigned, T0);
    let d = run(&pools, &w, T0);
    assert_eq!(
        d,
        vec![Decision::CreateIdle {
            pool: "linux".into()
        }]
    );
}

#[test]
fn idle_runners_above_min_idle_go_after_the_timeout_oldest_first_with_confirmation() {
    let pools = [pool("linux", &["linux"], 5, 1)];
    let mut w = World::default();
    runner(&mut w, "old", "linux", None, Phase::Online, T0);
    runner(&mut w, "new", "linux", None, Phase::Online, T0 + 100 * S);
    runner(&mut w, "keep", "linux", None, Phase::Online, T0 + 200 * S);
    assert!(run(&pools, &w, T0 + 299 * S).is_empty());
    assert_eq!(
        run(&pools, &w, T0 + 300 * S),
        vec![Decision::ConfirmIdle { name: "old".into() }]
    );
    assert_eq!(
        run(&pools, &w, T0 + 400 * S),
        vec![
            Decision::ConfirmIdle { name: "old".into() },
            Decision::ConfirmIdle { name: "new".into() }
        ]
    );
}

#[test]
fn a_busy_runner_is_never_chosen_for_removal() {
    let pools = [pool("linux", &["linux"], 5, 0)];
    let mut w = World::default();
    runner(&mut w, "busy", "linux", None, Phase::Assigned, T0);
    assert!(run(&pools, &w, T0 + 10_000 * S).is_empty());
}

#[test]
fn a_runner_goes_when_the_job_it_ran_completes() {
    let pools = [pool("linux", &["linux"], 5, 0)];
    let mut w = World::default();
    job(&mut w, 1, &["linux"], T0);
    runner(&mut w, "r1", "linux", Some(1), Phase::Assigned, T0);
    if let Some(r) = w.runners.get_mut("r1") {
        r.running = Some(jid(1));
    }
    if let Some(j) = w.jobs.get_mut(&jid(1)) {
        j.status = JobStatus::InProgress;
    }
    assert!(run(&pools, &w, T0).is_empty());
    if let Some(j) = w.jobs.get_mut(&jid(1)) {
        j.status = JobStatus::Completed;
    }
    assert_eq!(
        run(&pools, &w, T0),
        vec![Decision::Delete {
            name: "r1".into(),
            reason: "job_completed"
        }]
    );
}

/// A job event as the log carries it (id `e<n>`), folded into `w`.
fn observe(w: &mut World, n: u32, job_id: u64, status: JobStatus, runner_name: &str) {
    let event = runyard_events::Event {
        id: format!("e{n}"),
        body: Some(runyard_events::Body::JobObserved(
            runyard_events::JobObserved {
                job: Some(runyard_events::JobKey {
                    forge: Forge::Github as i32,
                    instance: "github.com".into(),
                    job_id,
                }),
                status: status as i32,
                runner_name: runner_name.into(),
                ..Default::default()
            },
        )),
        ..Default::default()
    };
    w.apply(&event, T0, |_| S);
}

#[test]
fn a_runner_that_took_a_second_job_goes_only_when_both_completed() {
    let pools = [pool("linux", &["linux"], 5, 0)];
    let mut w = World::default();
    job(&mut w, 1, &["linux"], T0);
    runner(&mut w, "r1", "linux", Some(1), Phase::Online, T0);
    observe(&mut w, 1, 1, JobStatus::InProgress, "r1");
    observe(&mut w, 2, 2, JobStatus::InProgress, "r1");
    observe(&mut w, 3, 1, JobStatus::Completed, "r1");
    assert!(run(&pools, &w, T0).is_empty(), "job 2 still runs on it");
    observe(&mut w, 4, 2, JobStatus::Completed, "r1");
    assert_eq!(
        run(&pools, &w, T0),
        vec![Decision::Delete {
            name: "r1".into(),
            reason: "job_completed"
        }]
    );
    // A completion delivered before the start leaves nothing running.
    let mut w = World::default();
    runner(&mut w, "r2", "linux", None, Phase::Online, T0);
    observe(&mut w, 1, 3, JobStatus::Completed, "r2");
    observe(&mut w, 2, 3, JobStatus::InProgress, "r2");
    assert!(w.runners["r2"].busy_with.is_empty());
    assert!(w.runner_done(&w.runners["r2"]));
}

#[test]
fn a_job_cancelled_before_its_runner_came_online_takes_the_runner_with_it() {
    let pools = [pool("linux", &["linux"], 5, 0)];
    let mut w = World::default();
    job(&mut w, 1, &["linux"], T0);
    runner(&mut w, "r1", "linux", Some(1), Phase::Created, T0);
    assert!(run(&pools, &w, T0 + S).is_empty());
    if let Some(j) = w.jobs.get_mut(&jid(1)) {
        j.status = JobStatus::Completed;
        j.cancelled = true;
    }
    assert_eq!(
        run(&pools, &w, T0 + 2 * S),
        vec![Decision::Delete {
            name: "r1".into(),
            reason: "job_cancelled"
        }]
    );
}

#[test]
fn a_stolen_runner_leaves_its_job_to_the_free_one() {
    // r1 was made for job 1 but took job 2; r2 (made for job 2) is free and
    // will take job 1: nothing new is created and nothing deleted.
    let pools = [pool("linux", &["linux"], 5, 0)];
    let mut w = World::default();
    job(&mut w, 1, &["linux"], T0);
    job(&mut w, 2, &["linux"], T0);
    if let Some(j) = w.jobs.get_mut(&jid(2)) {
        j.status = JobStatus::InProgress;
    }
    runner(&mut w, "r1", "linux", Some(1), Phase::Assigned, T0);
    if let Some(r) = w.runners.get_mut("r1") {
        r.running = Some(jid(2));
    }
    runner(&mut w, "r2", "linux", Some(2), Phase::Created, T0);
    assert!(run(&pools, &w, T0 + 20 * S).is_empty());
}

#[test]
fn a_runner_listed_busy_before_its_job_is_known_keeps_its_job() {
    // The forge's runner list said r1 is busy before any event said which
    // job it took: its own job 1 waits for it rather than getting a
    // replacement; once the start names job 2, r2 (made for job 2) is
    // free for job 1 — still nothing new.
    let pools = [pool("linux", &["linux"], 5, 0)];
    let mut w = World::default();
    job(&mut w, 1, &["linux"], T0);
    job(&mut w, 2, &["linux"], T0);
    runner(&mut w, "r1", "linux", Some(1), Phase::Assigned, T0);
    runner(&mut w, "r2", "linux", Some(2), Phase::Created, T0);
    let replaced = |d: &[Decision]| {
        d.iter()
            .filter(|d| matches!(d, Decision::Replace { .. } | Decision::Create { .. }))
            .count()
    };
    assert_eq!(replaced(&run(&pools, &w, T0 + 20 * S)), 0);
    if let Some(j) = w.jobs.get_mut(&jid(2)) {
        j.status = JobStatus::InProgress;
    }
    if let Some(r) = w.runners.get_mut("r1") {
        r.running = Some(jid(2));
    }
    assert_eq!(replaced(&run(&pools, &w, T0 + 21 * S)), 0);
    // With r2 gone too, job 1 does need a runner.
    if let Some(r) = w.runners.get_mut("r2") {
        r.phase = Phase::Deleted;
    }
    assert_eq!(replaced(&run(&pools, &w, T0 + 22 * S)), 1);
}

#[test]
fn a_runner_not_online_within_the_bootstrap_timeout_is_reaped() {
    let pools = [pool("linux", &["linux"], 5, 0)];
    let mut w = World::default();
    job(&mut w, 1, &["linux"], T0);
    runner(&mut w, "r1", "linux", Some(1), Phase::Created, T0);
    assert!(run(&pools, &w, T0 + 599 * S).is_empty());
    assert_eq!(
        run(&pools, &w, T0 + 600 * S),
        vec![Decision::Reap { name: "r1".into() }]
    );
}

#[test]
fn failed_creates_retry_after_their_back_off_then_give_up() {
    let pools = [pool("linux", &["linux"], 1, 0)];
    let mut w = World::default();
    job(&mut w, 1, &["linux"], T0);
    runner(&mut w, "r1", "linux", Some(1), Phase::Failed, T0);
    if let Some(r) = w.runners.get_mut("r1") {
        r.retry_at = Some(T0 + 4 * S);
    }
    assert!(
        run(&pools, &w, T0 + 3 * S).is_empty(),
        "no second runner while one retries"
    );
    assert_eq!(
        run(&pools, &w, T0 + 4 * S),
        vec![Decision::Retry { name: "r1".into() }]
    );
    if let Some(r) = w.runners.get_mut("r1") {
        r.attempts = 5;
    }
    assert_eq!(
        run(&pools, &w, T0 + 9 * S),
        vec![Decision::GiveUp { name: "r1".into() }]
    );
}

#[test]
fn a_failed_runner_stops_counting_toward_max() {
    let pools = [pool("linux", &["linux"], 1, 0)];
    let mut w = World::default();
    job(&mut w, 1, &["linux"], T0);
    job(&mut w, 2, &["linux"], T0 + S);
    runner(&mut w, "r1", "linux", Some(1), Phase::Failed, T0);
    if let Some(r) = w.runners.get_mut("r1") {
        r.retry_at = Some(T0 + 100 * S);
    }
    assert_eq!(creates(&run(&pools, &w, T0 + 2 * S)), vec![2]);
}

#[test]
fn a_failed_runner_whose_job_is_gone_is_dropped() {
    let pools = [pool("linux", &["linux"], 1, 0)];
    let mut w = World::default();
    job(&mut w, 1, &["linux"], T0);
    if let Some(j) = w.jobs.get_mut(&jid(1)) {
        j.status = JobStatus::Completed;
    }
    runner(&mut w, "r1", "linux", Some(1), Phase::Failed, T0);
    assert_eq!(
        run(&pools, &w, T0),
        vec![Decision::Delete {
            name: "r1".into(),
            reason: "failed"
        }]
    );
}

#[test]
fn runners_with_an_operation_under_way_get_no_second_decision() {
    let pools = [pool("linux", &["linux"], 5, 0)];
    let mut w = World::default();
    job(&mut w, 1, &["linux"], T0);
    runner(&mut w, "r1", "linux", Some(1), Phase::Created, T0);
    let d = decide(
        &pools,
        &w,
        &|_| true,
        &|n| n == "r1",
        T0 + 601 * S,
        &knobs(),
    );
    assert!(d.is_empty(), "{d:?}");
}

#[test]
fn only_owned_pools_are_acted_on() {
    let pools = [pool("a", &["x"], 5, 1), pool("b", &["y"], 5, 1)];
    let w = World::default();
    let d = decide(&pools, &w, &|p| p == "b", &|_| false, T0, &knobs());
    assert_eq!(d, vec![Decision::CreateIdle { pool: "b".into() }]);
}

#[test]
fn status_counts_runners_and_queue() {
    let pools = [pool("linux", &["linux"], 4, 1)];
    let mut w = World::default();
    job(&mut w, 1, &["linux"], T0);
    job(&mut w, 2, &["linux"], T0);
    runner(&mut w, "a", "linux", Some(1), Phase::Requested, T0);
    runner(&mut w, "b", "linux", None, Phase::Online, T0);
    runner(&mut w, "c", "linux", None, Phase::Assigned, T0);
    runner(&mut w, "d", "linux", None, Phase::Deleted, T0);
    let s = &status(&pools, &w, Balance::Spread)[0];
    assert_eq!(
        (s.actual, s.creating, s.idle, s.busy, s.queued),
        (3, 1, 1, 1, 2)
    );
    assert_eq!(s.desired, 4);
}

#[test]
fn a_claimed_job_left_without_any_runner_gets_a_replacement() {
    // r1 (made for job 1) took job 2; job 2's runner r2 failed for good and
    // is gone: job 1 has no runner left anywhere, so one is made for the pool.
    let pools = [pool("linux", &["linux"], 5, 0)];
    let mut w = World::default();
    job(&mut w, 1, &["linux"], T0);
    job(&mut w, 2, &["linux"], T0);
    if let Some(j) = w.jobs.get_mut(&jid(2)) {
        j.status = JobStatus::InProgress;
    }
    runner(&mut w, "r1", "linux", Some(1), Phase::Assigned, T0);
    if let Some(r) = w.runners.get_mut("r1") {
        r.running = Some(jid(2));
    }
    runner(&mut w, "r2", "linux", Some(2), Phase::Deleted, T0);
    assert_eq!(
        run(&pools, &w, T0 + S),
        vec![Decision::Replace {
            pool: "linux".into()
        }]
    );
    // With the replacement booting, nothing more.
    runner(&mut w, "spare", "linux", None, Phase::Requested, T0 + S);
    assert!(run(&pools, &w, T0 + 2 * S).is_empty());
}
