use runyard_events::{PipelineObserved, Source};
use time::macros::datetime;

use super::*;

const NOW: OffsetDateTime = datetime!(2026-06-01 12:00:00 UTC);
const GL: &str = "gitlab.example.com";

fn settings() -> RetrySection {
    RetrySection::default()
}

fn envelope(id: &str, forge: Forge, body: Body) -> Event {
    Event {
        id: id.into(),
        occurred_at: Some(runyard_events::timestamp(NOW - Duration::from_secs(300))),
        received_at: None,
        source: Some(Source {
            forge: forge as i32,
            instance: GL.into(),
            ..Source::default()
        }),
        body: Some(body),
    }
}

/// A failed GitLab job `id` of pipeline 500, completed 5 minutes ago.
fn gl_failed(id: u64, conclusion: Conclusion, reason: &str) -> Event {
    let j = JobObserved {
        job: Some(JobKey {
            forge: Forge::Gitlab as i32,
            instance: GL.into(),
            job_id: id,
        }),
        project: "acme/spack".into(),
        project_id: 34,
        pipeline_id: 500,
        run_attempt: 1,
        name: format!("build-{id}"),
        status: JobStatus::Completed as i32,
        conclusion: conclusion as i32,
        failure_reason: reason.into(),
        r#ref: "develop".into(),
        sha: "abc".into(),
        ..JobObserved::default()
    };
    envelope(
        &format!("gitlab:d:{id}:failed"),
        Forge::Gitlab,
        Body::JobObserved(j),
    )
}

fn pipeline(status: &str) -> Event {
    envelope(
        &format!("gitlab:p:pipeline:500:{status}"),
        Forge::Gitlab,
        Body::PipelineObserved(PipelineObserved {
            forge: Forge::Gitlab as i32,
            instance: GL.into(),
            pipeline_id: 500,
            project_id: 34,
            project: "acme/spack".into(),
            r#ref: "develop".into(),
            sha: "abc".into(),
            status: status.into(),
            ..PipelineObserved::default()
        }),
    )
}

/// A usage report of job `id` for workload `py-torch`.
fn report(id: u64, oom: bool, exit: i32, cgroup: &str) -> Event {
    envelope(
        &format!("usage:gitlab:{GL}:{id}:1"),
        Forge::Gitlab,
        Body::UsageReported(UsageReported {
            job: Some(JobKey {
                forge: Forge::Gitlab as i32,
                instance: GL.into(),
                job_id: id,
            }),
            attempt: 1,
            workload: [("package".to_owned(), "py-torch".to_owned())].into(),
            peak_memory_bytes: 1_000,
            memory_limit_bytes: Some(1_000),
            oom_killed: oom,
            exit_code: Some(exit),
            cgroup: cgroup.into(),
            ..UsageReported::default()
        }),
    )
}

fn book(events: &[Event]) -> Book {
    let mut b = Book::default();
    for e in events {
        b.observe(e);
    }
    b
}

fn reasons(plans: &[Plan]) -> Vec<&'static str> {
    plans
        .iter()
        .filter_map(|p| match p {
            Plan::Refuse { reason, .. } => Some(reason.as_str()),
            _ => None,
        })
        .collect()
}

/// A failed job `id` of pipeline `pipeline`.
fn gl_failed_in(id: u64, pipeline: u64) -> Event {
    let mut e = gl_failed(id, Conclusion::Failure, "script_failure");
    if let Some(Body::JobObserved(j)) = e.body.as_mut() {
        j.pipeline_id = pipeline;
    }
    e
}

/// Child pipeline `id` of parent `parent` in `status`.
fn child_pipeline(id: u64, parent: u64, status: &str) -> Event {
    let mut e = pipeline(status);
    e.id = format!("gitlab:p:pipeline:{id}:{status}");
    if let Some(Body::PipelineObserved(p)) = e.body.as_mut() {
        p.pipeline_id = id;
        p.pipeline_source = "parent_pipeline".into();
        p.parent_pipeline_id = parent;
        p.parent_project_id = 34;
    }
    e
}

#[test]
fn kills_in_child_pipelines_retry_their_parent_once() {
    let mut events = vec![
        child_pipeline(601, 600, "failed"),
        child_pipeline(602, 600, "failed"),
    ];
    for (job, pipeline) in [(1, 601), (2, 601), (3, 602)] {
        events.push(gl_failed_in(job, pipeline));
        events.push(report(job, true, 137, "v2"));
    }
    let plans = book(&events).plan(&settings(), NOW);
    let retries: Vec<_> = plans
        .iter()
        .filter_map(|p| match p {
            Plan::GitLabPipeline { target, jobs } => Some((target.clone(), jobs.len())),
            _ => None,
        })
        .collect();
    assert_eq!(retries.len(), 1, "one retry for the parent: {plans:?}");
    let (target, jobs) = &retries[0];
    assert_eq!(
        (target.pipeline_id, target.unit.as_str()),
        (600, "pipeline:600")
    );
    assert_eq!(target.r#ref, "develop");
    assert_eq!(*jobs, 3, "it covers every child's kills");
    // One child still running: the parent waits for none of it, the failed
    // one is enough.
    let mut events = vec![
        child_pipeline(601, 600, "failed"),
        child_pipeline(602, 600, "running"),
    ];
    events.extend([gl_failed_in(1, 601), report(1, true, 137, "v2")]);
    let plans = book(&events).plan(&settings(), NOW);
    assert!(
        matches!(plans.as_slice(), [Plan::GitLabPipeline { target, .. }] if target.pipeline_id == 600)
    );
}

#[test]
fn an_oom_killed_job_in_a_failed_pipeline_gets_one_new_pipeline() {
    let b = book(&[
        gl_failed(1, Conclusion::Failure, "script_failure"),
        report(1, true, 137, "v1"),
        pipeline("failed"),
    ]);
    let plans = b.plan(&settings(), NOW);
    assert_eq!(plans.len(), 1, "{plans:?}");
    let Plan::GitLabPipeline { target, jobs } = &plans[0] else {
        panic!("{plans:?}");
    };
    assert_eq!(
        (target.pipeline_id, target.project_id, target.r#ref.as_str()),
        (500, 34, "develop")
    );
    assert_eq!(target.unit, "pipeline:500");
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0].oom_streak, 1);
}

#[test]
fn the_order_of_hook_report_and_duplicates_does_not_matter() {
    let events = [
        gl_failed(1, Conclusion::Failure, ""),
        report(1, true, 137, "v2"),
        pipeline("failed"),
    ];
    let orders: [[usize; 6]; 3] = [[0, 1, 2, 0, 1, 2], [1, 2, 0, 1, 1, 0], [2, 0, 1, 2, 2, 1]];
    for order in orders {
        let evs: Vec<Event> = order.iter().map(|i| events[*i].clone()).collect();
        let plans = book(&evs).plan(&settings(), NOW);
        assert!(
            matches!(plans.as_slice(), [Plan::GitLabPipeline { jobs, .. }] if jobs[0].oom_streak == 1),
            "{order:?}: {plans:?}"
        );
    }
}

#[test]
fn a_pipeline_whose_status_is_unknown_is_read_from_the_forge() {
    let b = book(&[
        gl_failed(1, Conclusion::Failure, ""),
        report(1, true, 137, "v2"),
    ]);
    let plans = b.plan(&settings(), NOW);
    assert!(
        matches!(
            plans.as_slice(),
            [Plan::CheckPipeline { project_id: 34, .. }]
        ),
        "{plans:?}"
    );
    let mut b = b;
    b.set_pipeline_status(&(Forge::Gitlab, GL.into(), 500), "failed");
    assert!(matches!(
        b.plan(&settings(), NOW).as_slice(),
        [Plan::GitLabPipeline { .. }]
    ));
}

#[test]
fn failures_that_are_not_oom_are_refused_with_the_reason() {
    let b = book(&[
        gl_failed(1, Conclusion::Failure, "script_failure"),
        report(1, false, 1, "v2"),
        gl_failed(2, Conclusion::Failure, "job_execution_timeout"),
        gl_failed(3, Conclusion::TimedOut, ""),
        gl_failed(4, Conclusion::Cancelled, ""),
        pipeline("failed"),
    ]);
    assert_eq!(
        reasons(&b.plan(&settings(), NOW)),
        ["not_oom", "not_oom", "not_oom"]
    );
}

#[test]
fn a_missing_report_is_waited_for_then_refused() {
    let b = book(&[gl_failed(1, Conclusion::Failure, ""), pipeline("failed")]);
    let mut s = settings();
    s.wait_for_report = Duration::from_secs(600);
    assert!(b.plan(&s, NOW).is_empty(), "still waiting");
    s.wait_for_report = Duration::from_secs(60);
    assert_eq!(reasons(&b.plan(&s, NOW)), ["no_usage_report"]);
}

#[test]
fn exit_137_counts_as_oom_only_without_cgroup_data() {
    let with_cgroup = book(&[
        gl_failed(1, Conclusion::Failure, ""),
        report(1, false, 137, "v2"),
        pipeline("failed"),
    ]);
    assert_eq!(reasons(&with_cgroup.plan(&settings(), NOW)), ["not_oom"]);
    let without = book(&[
        gl_failed(1, Conclusion::Failure, ""),
        report(1, false, 137, ""),
        pipeline("failed"),
    ]);
    assert!(matches!(
        without.plan(&settings(), NOW).as_slice(),
        [Plan::GitLabPipeline { .. }]
    ));
}

#[test]
fn the_fourth_kill_in_a_row_is_refused_and_a_success_ends_the_streak() {
    let mut events = Vec::new();
    for id in 1..=4 {
        events.push(report(id, true, 137, "v1"));
    }
    events.push(gl_failed(4, Conclusion::Failure, ""));
    events.push(pipeline("failed"));
    let b = book(&events);
    let plans = b.plan(&settings(), NOW);
    assert_eq!(reasons(&plans), ["limit_reached"], "{plans:?}");
    let Plan::Refuse { detail, jobs, .. } = &plans[0] else {
        unreachable!()
    };
    assert_eq!(jobs[0].oom_streak, 4);
    assert!(detail.contains("OOM kill 4 in a row"), "{detail}");

    events.insert(3, report(10, false, 0, "v1"));
    let b = book(&events);
    let plans = b.plan(&settings(), NOW);
    assert!(
        matches!(plans.as_slice(), [Plan::GitLabPipeline { jobs, .. }] if jobs[0].oom_streak == 1),
        "a success resets the streak: {plans:?}"
    );
}

#[test]
fn a_decided_unit_is_not_decided_again() {
    let mut b = book(&[
        gl_failed(1, Conclusion::Failure, ""),
        report(1, true, 137, "v1"),
        pipeline("failed"),
    ]);
    let Plan::GitLabPipeline { target, jobs } = b.plan(&settings(), NOW).remove(0) else {
        panic!()
    };
    let id = ids::retry(Forge::Gitlab, GL, &target.unit, "requested");
    b.observe(&envelope(
        &id,
        Forge::Gitlab,
        Body::RetryRequested(runyard_events::RetryRequested {
            target: Some(target),
            strategy: "pipeline".into(),
            jobs,
        }),
    ));
    assert!(b.plan(&settings(), NOW).is_empty());
    assert_eq!(b.in_flight().count(), 1, "requested without an outcome");
}

#[test]
fn strategies_per_project() {
    let b = book(&[
        gl_failed(1, Conclusion::Failure, ""),
        report(1, true, 137, "v1"),
        pipeline("running"),
    ]);
    let mut s = settings();
    s.gitlab_strategy = Strategy::Job;
    let plans = b.plan(&s, NOW);
    assert!(
        matches!(plans.as_slice(), [Plan::GitLabJob { target, .. }] if target.unit == "job:1:1"),
        "{plans:?}"
    );
    s.projects.insert(
        "34".into(),
        crate::config::ProjectRetry {
            strategy: Strategy::Off,
        },
    );
    assert_eq!(reasons(&b.plan(&s, NOW)), ["strategy_off"]);
}

fn gh_failed(id: u64, attempt: u32) -> Event {
    let j = JobObserved {
        job: Some(JobKey {
            forge: Forge::Github as i32,
            instance: "github.com".into(),
            job_id: id,
        }),
        project: "acme/app".into(),
        pipeline_id: 9,
        run_attempt: attempt,
        name: format!("build-{id}"),
        status: JobStatus::Completed as i32,
        conclusion: Conclusion::Failure as i32,
        ..JobObserved::default()
    };
    envelope(&format!("github:{id}"), Forge::Github, Body::JobObserved(j))
}

fn gh_report(id: u64, attempt: u32, oom: bool, name: &str) -> Event {
    envelope(
        &format!("usage:github:github.com:{id}:{attempt}"),
        Forge::Github,
        Body::UsageReported(UsageReported {
            job: Some(JobKey {
                forge: Forge::Github as i32,
                instance: "github.com".into(),
                job_id: id,
            }),
            attempt,
            workload: [("job".to_owned(), name.to_owned())].into(),
            peak_memory_bytes: 1_000,
            memory_limit_bytes: Some(1_000),
            oom_killed: oom,
            exit_code: Some(if oom { 137 } else { 1 }),
            cgroup: "v2".into(),
            ..UsageReported::default()
        }),
    )
}

fn run(status: &str, attempt: u32) -> RunView {
    RunView {
        run: (Forge::Github, "github.com".into(), 9),
        repo: "acme/app".into(),
        status: status.into(),
        attempt,
        created_at: Some(NOW - Duration::from_secs(3600)),
        git_ref: "main".into(),
        sha: "abc".into(),
    }
}

fn listed(id: u64, attempt: u32, conclusion: &str) -> ListedJob {
    ListedJob {
        id,
        attempt,
        name: format!("build-{id}"),
        conclusion: Some(conclusion.into()),
        completed_at: Some(NOW - Duration::from_secs(60)),
    }
}

#[test]
fn github_waits_for_the_run_then_reruns_failed_jobs_when_all_were_oom() {
    let b = book(&[
        gh_failed(1, 1),
        gh_report(1, 1, true, "a"),
        gh_failed(2, 1),
        gh_report(2, 1, true, "b"),
    ]);
    let plans = b.plan(&settings(), NOW);
    assert!(
        matches!(plans.as_slice(), [Plan::CheckRun { repo, .. }] if repo == "acme/app"),
        "{plans:?}"
    );
    let jobs = [
        listed(1, 1, "failure"),
        listed(2, 1, "failure"),
        listed(3, 1, "success"),
    ];
    assert_eq!(
        b.decide_run(&run("in_progress", 1), &jobs, &settings(), NOW),
        RunDecision::Wait
    );
    let d = b.decide_run(&run("completed", 1), &jobs, &settings(), NOW);
    assert!(
        matches!(&d, RunDecision::RerunFailed { target, jobs } if target.unit == "run:9:1" && jobs.len() == 2),
        "{d:?}"
    );
}

#[test]
fn github_reruns_oom_jobs_one_at_a_time_beside_other_failures() {
    let b = book(&[
        gh_failed(1, 1),
        gh_report(1, 1, true, "a"),
        gh_failed(2, 1),
        gh_report(2, 1, false, "b"),
    ]);
    let jobs = [listed(1, 1, "failure"), listed(2, 1, "failure")];
    let d = b.decide_run(&run("completed", 1), &jobs, &settings(), NOW);
    assert!(
        matches!(&d, RunDecision::RerunJob { job, .. } if job.job.as_ref().map(|k| k.job_id) == Some(1)),
        "{d:?}"
    );
    // A report still on its way holds the decision.
    let b = book(&[gh_failed(1, 1), gh_report(1, 1, true, "a"), gh_failed(2, 1)]);
    assert_eq!(
        b.decide_run(&run("completed", 1), &jobs, &settings(), NOW),
        RunDecision::Wait
    );
}

#[test]
fn github_limits_are_refusals() {
    let b = book(&[gh_failed(1, 1), gh_report(1, 1, true, "a")]);
    let jobs = [listed(1, 50, "failure")];
    let d = b.decide_run(&run("completed", 50), &jobs, &settings(), NOW);
    assert!(
        matches!(
            d,
            RunDecision::Refuse {
                reason: RetryRefusal::MaxAttempts,
                ..
            }
        ),
        "{d:?}"
    );
    let mut old = run("completed", 1);
    old.created_at = Some(NOW - Duration::from_secs(31 * 24 * 3600));
    let d = b.decide_run(&old, &[listed(1, 1, "failure")], &settings(), NOW);
    assert!(
        matches!(
            d,
            RunDecision::Refuse {
                reason: RetryRefusal::RerunWindowExpired,
                ..
            }
        ),
        "{d:?}"
    );
}

/// What a job's report says of its workload in round `n` of a kill loop:
/// nothing, or another workload each round.
#[derive(Clone, Copy, Debug)]
enum Claimed {
    Nothing,
    Another,
}

impl Claimed {
    fn workload(self, n: u64) -> std::collections::HashMap<String, String> {
        match self {
            Claimed::Nothing => Default::default(),
            Claimed::Another => [("package".to_owned(), format!("pkg-{n}"))].into(),
        }
    }
}

/// The OOM-killed report of job `job` (attempt 1, as `runyard-report` says
/// on GitLab) with `claimed`'s workload of round `n`.
fn kill_report(forge: Forge, instance: &str, job: u64, attempt: u32, w: Claimed, n: u64) -> Event {
    envelope(
        &format!("usage:{}:{instance}:{job}:{attempt}", forge_token(forge)),
        forge,
        Body::UsageReported(UsageReported {
            job: Some(JobKey {
                forge: forge as i32,
                instance: instance.into(),
                job_id: job,
            }),
            attempt,
            workload: w.workload(n),
            peak_memory_bytes: 1_000,
            memory_limit_bytes: Some(1_000),
            oom_killed: true,
            exit_code: Some(137),
            cgroup: "v2".into(),
            ..UsageReported::default()
        }),
    )
}

/// Job `job` of GitLab pipeline `pipeline` (attempt `attempt`), always
/// named `build py-torch`, failed.
fn gl_killed(job: u64, pipeline: u64, attempt: u32) -> Event {
    let mut e = gl_failed(job, Conclusion::Failure, "script_failure");
    e.id = format!("gitlab:d:{job}:{pipeline}:failed");
    if let Some(Body::JobObserved(j)) = e.body.as_mut() {
        j.pipeline_id = pipeline;
        j.run_attempt = attempt;
        j.name = "build py-torch".into();
    }
    e
}

fn issued(
    target: &RetryTarget,
    strategy: &str,
    jobs: Vec<RetryJob>,
    edit: impl FnOnce(&mut runyard_events::RetryIssued),
) -> Event {
    let forge = target.forge();
    let mut i = runyard_events::RetryIssued {
        target: Some(target.clone()),
        strategy: strategy.into(),
        jobs,
        ..Default::default()
    };
    edit(&mut i);
    envelope(
        &ids::retry(forge, &target.instance, &target.unit, "issued"),
        forge,
        Body::RetryIssued(i),
    )
}

fn refused(plan: &Plan) -> Event {
    let Plan::Refuse {
        id,
        target,
        reason,
        detail,
        jobs,
    } = plan
    else {
        panic!("{plan:?}")
    };
    envelope(
        id,
        target.forge(),
        Body::RetryRefused(runyard_events::RetryRefused {
            target: Some(target.clone()),
            reason: reason.as_str().into(),
            detail: detail.clone(),
            jobs: jobs.clone(),
            ..Default::default()
        }),
    )
}

/// Five OOM kills in a row of one GitLab job through its retries, each
/// report claiming `w`: the retries the book issues (each fed back in as
/// `RetryIssued`, as the shell does) and the refusals' details.
fn gitlab_kill_loop(strategy: Strategy, w: Claimed) -> (usize, Vec<String>) {
    let mut s = settings();
    s.gitlab_strategy = strategy;
    let mut b = Book::default();
    let (mut job, mut pl, mut attempt) = (4701u64, 1234u64, 1u32);
    let (mut retries, mut refusals) = (0, Vec::new());
    for n in 1..=5u64 {
        for e in [
            gl_killed(job, pl, attempt),
            kill_report(Forge::Gitlab, GL, job, 1, w, n),
        ] {
            b.observe(&e);
        }
        let mut p = pipeline("failed");
        p.id = format!("gitlab:p:{pl}:failed");
        if let Some(Body::PipelineObserved(po)) = p.body.as_mut() {
            po.pipeline_id = pl;
        }
        b.observe(&p);
        let plans = b.plan(&s, NOW);
        assert_eq!(plans.len(), 1, "round {n}: {plans:?}");
        match &plans[0] {
            Plan::GitLabPipeline { target, jobs } => {
                retries += 1;
                let new = 9000 + n;
                b.observe(&issued(target, "pipeline", jobs.clone(), |i| {
                    i.new_pipeline_id = new;
                }));
                (job, pl) = (job + 100, new);
            }
            Plan::GitLabJob { target, job: j } => {
                retries += 1;
                let new = job + 100;
                b.observe(&issued(target, "job", vec![j.clone()], |i| {
                    i.new_job_ids = vec![new];
                }));
                (job, attempt) = (new, attempt + 1);
            }
            refusal @ Plan::Refuse { detail, .. } => {
                refusals.push(detail.clone());
                b.observe(&refused(refusal));
                // The forge's own retry (a person's): another job, new id.
                job += 100;
                attempt += 1;
            }
            other => panic!("round {n}: {other:?}"),
        }
    }
    (retries, refusals)
}

#[test]
fn five_gitlab_kills_get_three_retries_whatever_the_reports_claim() {
    for strategy in [Strategy::Pipeline, Strategy::Job] {
        for w in [Claimed::Nothing, Claimed::Another] {
            let (retries, refusals) = gitlab_kill_loop(strategy, w);
            assert_eq!(retries, 3, "{strategy:?}, {w:?}: {refusals:?}");
            assert_eq!(refusals.len(), 2, "{strategy:?}, {w:?}");
            assert!(
                refusals[0].contains("3 retries already issued"),
                "{strategy:?}, {w:?}: {}",
                refusals[0]
            );
        }
    }
}

#[test]
fn five_github_kills_get_three_reruns_whatever_the_reports_claim() {
    for w in [Claimed::Nothing, Claimed::Another] {
        let mut b = Book::default();
        let mut retries = 0;
        for n in 1..=5u32 {
            // Each re-run is a new job id in the next attempt of run 9.
            let job = 100 + u64::from(n);
            let mut failed = gh_failed(job, n);
            if let Some(Body::JobObserved(j)) = failed.body.as_mut() {
                j.name = "build".into();
                j.r#ref = "main".into();
            }
            // The report first (the job's last step runs before GitHub
            // says the job completed; an earlier webhook may be lost).
            b.observe(&kill_report(
                Forge::Github,
                "github.com",
                job,
                n,
                w,
                n.into(),
            ));
            b.observe(&failed);
            for plan in b.plan(&settings(), NOW) {
                if let refusal @ Plan::Refuse { .. } = &plan {
                    b.observe(&refused(refusal));
                }
            }
            let mut listed = listed(job, n, "failure");
            listed.name = "build".into();
            match b.decide_run(&run("completed", n), &[listed], &settings(), NOW) {
                RunDecision::RerunFailed { target, jobs } => {
                    retries += 1;
                    b.observe(&issued(&target, "rerun_failed_jobs", jobs, |i| {
                        i.new_run_attempt = n + 1;
                    }));
                }
                RunDecision::Settled => {}
                other => panic!("round {n}: {other:?}"),
            }
        }
        assert_eq!(retries, 3, "{w:?}");
    }
}

#[test]
fn a_success_of_the_job_ends_its_lineage_by_name() {
    let mut b = Book::default();
    let mut s = settings();
    s.gitlab_strategy = Strategy::Job;
    let target = job_target(&FailedJob {
        job: (Forge::Gitlab, GL.into(), 1),
        attempt: 1,
        name: "build py-torch".into(),
        project: "acme/spack".into(),
        project_id: 34,
        pipeline_id: 500,
        git_ref: "develop".into(),
        sha: "abc".into(),
        conclusion: Conclusion::Failure,
        failure_reason: String::new(),
        failed_at: NOW,
    });
    for n in 0..3 {
        let mut t = target.clone();
        t.unit = format!("job:{n}:1");
        let job = RetryJob {
            name: "build py-torch".into(),
            ..RetryJob::default()
        };
        b.observe(&issued(&t, "pipeline", vec![job], |i| {
            i.new_pipeline_id = 0
        }));
    }
    let killed = gl_killed(77, 700, 1);
    b.observe(&killed);
    b.observe(&kill_report(Forge::Gitlab, GL, 77, 1, Claimed::Nothing, 1));
    assert_eq!(reasons(&b.plan(&s, NOW)), ["limit_reached"]);
    let mut ok = gl_killed(78, 701, 1);
    if let Some(Body::JobObserved(j)) = ok.body.as_mut() {
        j.conclusion = Conclusion::Success as i32;
    }
    let mut b2 = b;
    b2.observe(&ok);
    let plans = b2.plan(&s, NOW);
    assert!(
        matches!(plans.as_slice(), [Plan::GitLabJob { .. }]),
        "{plans:?}"
    );
}
