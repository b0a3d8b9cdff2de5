//! Given events fed in and the clock stepped, then these effects.

use runyard_events::{
    Conclusion, JobObserved, RunnerCreated, RunnerDeleted, RunnerFailed, RunnerOnline, RunnerRef,
};

use super::*;
use crate::core::policy::Balance;

const S: Duration = Duration::from_secs(1);
const T0: Duration = Duration::from_secs(1_000_000);
const LINUX: &str = "linux";
const HOST: &str = "github.com";

fn spec(name: &str, labels: &[&str], max_runners: u32, min_idle: u32) -> PoolSpec {
    PoolSpec {
        name: name.into(),
        forge: Forge::Github,
        instance: HOST.into(),
        labels: labels.iter().map(|l| l.to_ascii_lowercase()).collect(),
        min_idle,
        max_runners,
        idle_timeout: 300 * S,
        bootstrap_timeout: 600 * S,
        priority: 0,
        repos: None,
        scale_set: false,
    }
}

fn ts(t: Clock) -> prost_types::Timestamp {
    timestamp(t)
}

/// The name of the runner made for job `n`'s first run attempt.
fn runner_for(n: u64) -> String {
    instance_name(LINUX, &claim_key(Forge::Github, HOST, n, 1))
}

fn rref(name: &str) -> RunnerRef {
    RunnerRef {
        pool: LINUX.into(),
        name: name.into(),
        pool_id: format!("id-{LINUX}"),
        provider: "local".into(),
        forge: Forge::Github as i32,
        instance: HOST.into(),
    }
}

fn event(id: String, at: Clock, body: Body) -> Event {
    Event {
        id,
        occurred_at: Some(ts(at)),
        received_at: Some(ts(at)),
        source: None,
        body: Some(body),
    }
}

/// What a user would notice of an effect, runners named by their job.
fn describe(e: &Effect) -> String {
    let runner = |name: &str| {
        (1..100)
            .find(|&n| runner_for(n) == name)
            .map_or_else(|| name.to_owned(), |n| format!("r{n}"))
    };
    match e {
        Effect::Labels { job, .. } => format!("labels {}", job.job_id),
        Effect::Create { pool, job, .. } => format!("create {pool} for {}", job.id.job_id),
        Effect::CreateFree { pool, reason, .. } => format!("create {pool} {reason}"),
        Effect::Retry { name, attempt, .. } => format!("retry {} attempt {attempt}", runner(name)),
        Effect::GiveUp { runner: r } => format!("give up {}", runner(&r.name)),
        Effect::Reap { runner: r } => format!("reap {}", runner(&r.name)),
        Effect::Delete { runner: r, reason } => format!("delete {} {reason}", runner(&r.name)),
        Effect::ConfirmIdle { runner: r, .. } => format!("confirm idle {}", runner(&r.name)),
        Effect::Unserved { job, reason, .. } => format!("unserved {} {reason}", job.id.job_id),
        Effect::Assigned { name, job, .. } => format!("assigned {} {}", runner(name), job.job_id),
    }
}

fn described(effects: &[Effect]) -> Vec<String> {
    effects.iter().map(describe).collect()
}

/// A core owning every pool, driven at a clock the test steps.
struct Harness {
    core: Core,
    now: Clock,
}

impl Harness {
    fn new(pools: Vec<PoolSpec>) -> Self {
        let pool_ids = pools
            .iter()
            .map(|p| (p.name.clone(), format!("id-{}", p.name)))
            .collect();
        let names: Vec<String> = pools.iter().map(|p| p.name.clone()).collect();
        let mut core = Core::new(Settings {
            pools,
            pool_ids,
            replica: "r".into(),
            knobs: Knobs {
                idle_backoff: 10 * S,
                create_attempts: 5,
                balance: Balance::Spread,
            },
            busy_confirmation: 30 * S,
            backoff: Backoff {
                base: 2 * S,
                max: 60 * S,
                jitter: std::sync::Arc::new(|| 1.0),
            },
            lookup_labels: false,
        });
        for name in &names {
            core.own(name, true);
        }
        Self { core, now: T0 }
    }

    fn step(&mut self, by: Duration) {
        self.now += by;
    }

    fn decide(&mut self) -> Vec<String> {
        described(&self.core.decide(self.now).effects)
    }

    fn observe(&mut self, event: &Event) -> Vec<String> {
        described(&self.core.observe(event, self.now))
    }

    fn done(&mut self, name: &str, events: &[Event]) -> Vec<String> {
        described(&self.core.done(name, events, None, self.now))
    }

    /// Job `n` (attempt `attempt`) observed in `status` now, on `runner`:
    /// the effects of folding it in.
    fn job(
        &mut self,
        n: u64,
        attempt: u32,
        status: JobStatus,
        labels: &[&str],
        runner: &str,
    ) -> Vec<String> {
        let mut j = JobObserved {
            job: Some(JobKey {
                forge: Forge::Github as i32,
                instance: HOST.into(),
                job_id: n,
            }),
            project: "acme/app".into(),
            run_attempt: attempt,
            name: format!("job {n}"),
            labels: labels.iter().map(|l| (*l).to_owned()).collect(),
            runner_name: runner.into(),
            created_at: Some(ts(self.now)),
            ..Default::default()
        };
        j.set_status(status);
        if status == JobStatus::Completed {
            j.set_conclusion(Conclusion::Success);
        }
        let id = format!("job:{n}:{attempt}:{status:?}");
        self.observe(&event(id, self.now, Body::JobObserved(j)))
    }

    fn queued(&mut self, n: u64, labels: &[&str]) {
        let effects = self.job(n, 1, JobStatus::Queued, labels, "");
        assert!(effects.is_empty(), "{effects:?}");
    }

    /// Job `n` queued, then a round that creates its runner (named).
    fn create_for(&mut self, n: u64) -> String {
        self.queued(n, &["linux"]);
        assert_eq!(self.decide(), [format!("create linux for {n}")]);
        runner_for(n)
    }

    fn created(&self, name: &str, attempt: u32) -> Event {
        event(
            format!("{name}:created:{attempt}"),
            self.now,
            Body::RunnerCreated(RunnerCreated {
                runner: Some(rref(name)),
                provider_id: format!("p-{name}"),
                forge_runner_id: Some(7),
                attempt,
                status: "running".into(),
            }),
        )
    }

    fn online(&self, name: &str) -> Event {
        event(
            format!("{name}:online"),
            self.now,
            Body::RunnerOnline(RunnerOnline {
                runner: Some(rref(name)),
                source: "callback".into(),
            }),
        )
    }

    fn failed(&self, name: &str, attempt: u32) -> Event {
        event(
            format!("{name}:failed:{attempt}"),
            self.now,
            Body::RunnerFailed(RunnerFailed {
                runner: Some(rref(name)),
                reason: "create_failed".into(),
                error: "the provider said no".into(),
                attempt,
                given_up: false,
                job: None,
            }),
        )
    }

    fn deleted(&self, name: &str) -> Event {
        event(
            format!("{name}:deleted"),
            self.now,
            Body::RunnerDeleted(RunnerDeleted {
                runner: Some(rref(name)),
                reason: "job_completed".into(),
            }),
        )
    }
}

fn linux() -> Vec<PoolSpec> {
    vec![spec(LINUX, &["self-hosted", "linux"], 10, 0)]
}

#[test]
fn a_queued_job_gets_one_create_and_no_second_while_it_is_under_way() {
    let mut h = Harness::new(linux());
    h.queued(1, &["self-hosted", "Linux"]);
    assert_eq!(h.decide(), ["create linux for 1"]);
    let r1 = runner_for(1);
    assert!(h.core.in_flight(&r1));
    assert_eq!(h.core.world().runners[&r1].phase, Phase::Requested);
    h.step(S);
    assert_eq!(h.decide(), Vec::<String>::new(), "the create is under way");
    // Made, the runner serves its job: still no second one.
    assert!(h.done(&r1, &[h.created(&r1, 1)]).is_empty());
    assert!(!h.core.in_flight(&r1));
    h.step(S);
    assert_eq!(h.decide(), Vec::<String>::new());
}

#[test]
fn a_pool_this_replica_does_not_own_decides_nothing() {
    let mut h = Harness::new(vec![
        spec(LINUX, &["linux"], 10, 1),
        spec("arm", &["arm"], 10, 0),
    ]);
    h.core.own(LINUX, false);
    h.core.own("arm", false);
    h.queued(1, &["linux"]);
    h.queued(2, &["arm"]);
    assert_eq!(h.decide(), Vec::<String>::new(), "no pool owned");
    h.core.own(LINUX, true);
    assert_eq!(
        h.decide(),
        ["create linux for 1", "create linux min_idle"],
        "only the owned pool's job and idle runner"
    );
    // The lease lost, a new job waits for whichever replica holds it.
    h.core.own(LINUX, false);
    h.queued(3, &["linux"]);
    h.step(S);
    assert_eq!(h.decide(), Vec::<String>::new());
}

#[test]
fn a_job_no_pool_covers_is_said_unserved_once_per_attempt() {
    let mut h = Harness::new(linux());
    // Said by every replica alike (the event id makes it one): owning no
    // pool changes nothing.
    h.core.own(LINUX, false);
    h.queued(1, &["self-hosted", "gpu"]);
    let round = h.core.decide(h.now);
    let [Effect::Unserved { reason, event, .. }] = round.effects.as_slice() else {
        panic!("{:?}", described(&round.effects));
    };
    assert_eq!(*reason, "no_matching_pool");
    assert_eq!(event.id, "unserved:github:github.com:1:1:no_matching_pool");
    let Some(Body::JobUnserved(u)) = &event.body else {
        panic!("{event:?}");
    };
    assert_eq!(u.labels, ["self-hosted", "gpu"]);
    assert_eq!(event.occurred_at, Some(ts(T0)));
    let op = format!("unserved:{}", event.id);
    assert!(h.core.in_flight(&op));
    h.done(&op, &[]);
    h.step(S);
    assert_eq!(h.decide(), Vec::<String>::new(), "said once");
    // The job done and forgotten, its next attempt is said again.
    h.job(1, 1, JobStatus::Completed, &["self-hosted", "gpu"], "");
    h.step(2 * 86_400 * S);
    h.core.prune(h.now, 86_400 * S);
    h.job(1, 2, JobStatus::Queued, &["self-hosted", "gpu"], "");
    let round = h.core.decide(h.now);
    let [Effect::Unserved { event, .. }] = round.effects.as_slice() else {
        panic!("{:?}", described(&round.effects));
    };
    assert_eq!(event.id, "unserved:github:github.com:1:2:no_matching_pool");
}

#[test]
fn a_failed_create_is_retried_once_its_back_off_has_passed_and_not_before() {
    let mut h = Harness::new(linux());
    let r1 = h.create_for(1);
    h.step(S);
    // The first back-off is 2 s from the failure.
    h.done(&r1, &[h.failed(&r1, 1)]);
    assert_eq!(h.decide(), Vec::<String>::new(), "no new runner either");
    h.step(S);
    assert_eq!(h.decide(), Vec::<String>::new(), "1 s of 2");
    h.step(S);
    assert_eq!(h.decide(), ["retry r1 attempt 2"]);
    assert_eq!(h.core.world().runners[&r1].phase, Phase::Requested);
    assert_eq!(h.decide(), Vec::<String>::new(), "the retry is under way");
    // The second back-off doubles.
    h.done(&r1, &[h.failed(&r1, 2)]);
    h.step(3 * S);
    assert_eq!(h.decide(), Vec::<String>::new(), "3 s of 4");
    h.step(S);
    assert_eq!(h.decide(), ["retry r1 attempt 3"]);
}

#[test]
fn a_completed_jobs_runner_is_removed() {
    let mut h = Harness::new(linux());
    let r1 = h.create_for(1);
    h.step(S);
    h.done(&r1, &[h.created(&r1, 1), h.online(&r1)]);
    h.step(S);
    // The pool's owner records the assignment, once.
    let started = |h: &mut Harness| h.job(1, 1, JobStatus::InProgress, &["linux"], &r1);
    assert_eq!(started(&mut h), ["assigned r1 1"]);
    assert_eq!(started(&mut h), Vec::<String>::new());
    assert_eq!(h.decide(), Vec::<String>::new(), "its job runs");
    h.step(S);
    h.job(1, 1, JobStatus::Completed, &["linux"], &r1);
    assert_eq!(h.decide(), ["delete r1 job_completed"]);
    assert_eq!(h.decide(), Vec::<String>::new(), "the delete is under way");
    h.done(&r1, &[h.deleted(&r1)]);
    assert_eq!(h.core.world().runners[&r1].phase, Phase::Deleted);
    assert_eq!(h.decide(), Vec::<String>::new());
}

#[test]
fn max_runners_caps_the_creates_until_a_runner_goes() {
    let mut h = Harness::new(vec![spec(LINUX, &["linux"], 2, 0)]);
    for n in 1..=3 {
        h.queued(n, &["linux"]);
        h.step(S);
    }
    assert_eq!(h.decide(), ["create linux for 1", "create linux for 2"]);
    let status = h.core.decide(h.now).status;
    assert_eq!((status[0].actual, status[0].queued), (2, 3));
    let r1 = runner_for(1);
    h.done(&r1, &[h.created(&r1, 1), h.online(&r1)]);
    assert_eq!(
        h.job(1, 1, JobStatus::InProgress, &["linux"], &r1),
        ["assigned r1 1"]
    );
    h.step(S);
    assert_eq!(
        h.decide(),
        Vec::<String>::new(),
        "job 3 waits: the pool is full"
    );
    h.job(1, 1, JobStatus::Completed, &["linux"], &r1);
    assert_eq!(h.decide(), ["delete r1 job_completed"], "still full");
    h.done(&r1, &[h.deleted(&r1)]);
    assert_eq!(h.decide(), ["create linux for 3"]);
}

#[test]
fn an_abandoned_create_leaves_its_job_without_a_runner() {
    let mut h = Harness::new(linux());
    let r1 = h.create_for(1);
    // The job had started elsewhere.
    let job = JobId {
        forge: Forge::Github,
        instance: HOST.into(),
        job_id: 1,
    };
    h.core.abandoned(&r1, Some(&job));
    assert!(!h.core.in_flight(&r1));
    assert!(!h.core.world().runners.contains_key(&r1));
    h.step(S);
    assert_eq!(h.decide(), Vec::<String>::new());
}

fn registration(id: u64, name: &str, busy: bool) -> crate::forges::ForgeRunner {
    crate::forges::ForgeRunner {
        id,
        name: name.into(),
        online: true,
        busy,
        paused: false,
        running_jobs: Vec::new(),
    }
}

/// The forge's listing of the `linux` pool (no provider listing).
fn forge_listing(runners: &[crate::forges::ForgeRunner]) -> Listing<'_> {
    Listing {
        pool: LINUX,
        scope: "id-linux",
        restart_stopped: false,
        instances: None,
        forge: Some(runners),
    }
}

#[test]
fn a_listing_brings_a_booting_runner_online_and_removes_a_stranger_at_its_second_sighting() {
    let mut h = Harness::new(linux());
    let r1 = h.create_for(1);
    h.done(&r1, &[h.created(&r1, 1)]);
    assert_eq!(h.core.world().runners[&r1].phase, Phase::Created);
    let listed = [
        registration(7, &r1, false),
        registration(99, "ry-linux-stranger", false),
    ];
    // The first listing: r1 is online; the stranger is only noted.
    let findings = h.core.listed(&forge_listing(&listed));
    let [Finding::Online { name }] = findings.as_slice() else {
        panic!("{findings:?}");
    };
    assert_eq!(name, &r1);
    assert!(h.core.in_flight(&r1), "the online event is under way");
    // The second: the stranger, seen twice in a row, goes; r1 is not
    // brought online twice while the first is under way.
    let findings = h.core.listed(&forge_listing(&listed));
    let [Finding::Orphan { name, forge_id, .. }] = findings.as_slice() else {
        panic!("{findings:?}");
    };
    assert_eq!((name.as_str(), *forge_id), ("ry-linux-stranger", Some(99)));
    assert!(h.core.in_flight("orphan:ry-linux-stranger"));
    h.done(&r1, &[h.online(&r1)]);
    assert_eq!(h.core.world().runners[&r1].phase, Phase::Online);
    // The third, with the removal under way: nothing.
    let findings = h.core.listed(&forge_listing(&listed));
    assert!(findings.is_empty(), "{findings:?}");
    h.core.end("orphan:ry-linux-stranger");
    let findings = h.core.listed(&forge_listing(&listed[..1]));
    assert!(findings.is_empty(), "{findings:?}");
}

#[test]
fn a_busy_stranger_is_never_removed() {
    let mut h = Harness::new(linux());
    let listed = [registration(99, "ry-linux-stranger", true)];
    for _ in 0..3 {
        let findings = h.core.listed(&forge_listing(&listed));
        assert!(findings.is_empty(), "{findings:?}");
    }
}

#[test]
fn a_runner_listed_busy_learns_its_job_when_the_job_starts() {
    let mut h = Harness::new(vec![spec(LINUX, &["linux"], 4, 0)]);
    let r1 = h.create_for(1);
    let r2 = h.create_for(2);
    h.done(&r1, &[h.created(&r1, 1), h.online(&r1)]);
    h.done(&r2, &[h.created(&r2, 1)]);
    // r1 is listed busy before any start names its job: it is taken to run
    // its own, job 1, and r2 still boots for job 2.
    let mut booting = registration(7, &r2, false);
    booting.online = false;
    h.core
        .listed(&forge_listing(&[registration(7, &r1, true), booting]));
    assert_eq!(h.core.world().runners[&r1].phase, Phase::Assigned);
    assert_eq!(h.decide(), Vec::<String>::new());
    // The forge had handed r1 job 2: r2 is job 1's now, not a surplus.
    assert_eq!(
        h.job(2, 1, JobStatus::InProgress, &["linux"], &r1),
        ["assigned r1 2"]
    );
    h.step(S);
    assert_eq!(h.decide(), Vec::<String>::new(), "r2 waits for job 1");
    // Job 2 done: only its runner goes.
    h.job(2, 1, JobStatus::Completed, &["linux"], &r1);
    assert_eq!(h.decide(), ["delete r1 job_completed"]);
}

#[test]
fn a_free_runner_listed_busy_frees_the_runner_of_the_job_it_took() {
    let mut h = Harness::new(vec![spec(LINUX, &["linux"], 4, 0)]);
    let runners: Vec<String> = (1..=3).map(|n| h.create_for(n)).collect();
    for r in &runners {
        h.done(r, &[h.created(r, 1)]);
    }
    // r3 took job 1: r1 is free, and job 3 waits for it.
    h.done(&runners[2], &[h.online(&runners[2])]);
    h.job(1, 1, JobStatus::InProgress, &["linux"], &runners[2]);
    h.step(S);
    assert_eq!(h.decide(), Vec::<String>::new());
    // r1 is listed busy before the start says it took job 2: job 3 waits
    // for r2, which job 2 no longer needs. Nothing is made for job 3.
    let mut booting = registration(7, &runners[1], false);
    booting.online = false;
    h.core.listed(&forge_listing(&[
        registration(7, &runners[0], true),
        booting,
    ]));
    h.step(S);
    assert_eq!(h.decide(), Vec::<String>::new(), "no replacement");
    assert_eq!(
        h.job(2, 1, JobStatus::InProgress, &["linux"], &runners[0]),
        ["assigned r1 2"]
    );
    h.step(S);
    assert_eq!(h.decide(), Vec::<String>::new(), "r2 waits for job 3");
    let alive = h
        .core
        .world()
        .runners
        .values()
        .filter(|r| r.is_alive())
        .count();
    assert_eq!(alive, 3, "three runners for three jobs");
}

/// A round that reads one idle runner: whether the reading confirms an
/// earlier one.
fn confirm_reading(h: &mut Harness) -> bool {
    let round = h.core.decide(h.now);
    let [Effect::ConfirmIdle { confirmed, .. }] = round.effects.as_slice() else {
        panic!("{:?}", described(&round.effects));
    };
    *confirmed
}

#[test]
fn an_idle_runner_goes_only_after_two_idle_readings_a_window_apart() {
    let mut h = Harness::new(linux());
    let r1 = h.create_for(1);
    h.done(&r1, &[h.created(&r1, 1), h.online(&r1)]);
    // The job cancelled before it started: r1 is idle, above min_idle.
    h.job(1, 1, JobStatus::Completed, &["linux"], "");
    h.step(299 * S);
    assert_eq!(
        h.decide(),
        Vec::<String>::new(),
        "the idle timeout is 300 s"
    );
    h.step(S);
    assert!(!confirm_reading(&mut h), "a first reading confirms nothing");
    h.core.done(&r1, &[], Some(Local::Idle), h.now);
    h.step(14 * S);
    assert_eq!(
        h.decide(),
        Vec::<String>::new(),
        "two readings per 30 s window"
    );
    h.step(S);
    assert!(
        !confirm_reading(&mut h),
        "15 s after the first idle reading"
    );
    h.core.done(&r1, &[], Some(Local::Idle), h.now);
    h.step(15 * S);
    assert!(
        confirm_reading(&mut h),
        "a window after the first idle reading"
    );
    // The forge says it took a job meanwhile: it stays.
    h.core.done(&r1, &[], Some(Local::Busy(Vec::new())), h.now);
    h.step(60 * S);
    assert_eq!(
        h.decide(),
        Vec::<String>::new(),
        "a busy runner is not read again"
    );
}

#[test]
fn a_waiting_job_says_what_the_forge_holds_it_for() {
    let mut h = Harness::new(linux());
    for (n, forge, status) in [
        (1, Forge::Gitlab, "created"),
        (2, Forge::Gitlab, "waiting_for_resource"),
        (3, Forge::Gitlab, "scheduled"),
        (4, Forge::Github, "waiting"),
    ] {
        let mut j = JobObserved {
            job: Some(JobKey {
                forge: forge as i32,
                instance: HOST.into(),
                job_id: n,
            }),
            project: "acme/app".into(),
            name: format!("job {n}"),
            forge_status: status.into(),
            created_at: Some(ts(h.now)),
            ..Default::default()
        };
        j.set_status(JobStatus::Waiting);
        h.observe(&event(format!("job:{n}"), h.now, Body::JobObserved(j)));
    }
    let mut why: Vec<(u64, &str, String)> = h
        .core
        .queued_jobs(h.now)
        .into_iter()
        .map(|q| (q.job_id, q.reason, q.detail))
        .collect();
    why.sort_by_key(|w| w.0);
    assert_eq!(why.len(), 4, "{why:?}");
    assert!(why.iter().all(|w| w.1 == "forge_waiting"), "{why:?}");
    assert!(why[0].2.contains("its stage"), "{why:?}");
    assert!(why[1].2.contains("resource group"), "{why:?}");
    assert!(why[2].2.contains("scheduled time"), "{why:?}");
    assert!(why[3].2.contains("approval"), "{why:?}");
}
