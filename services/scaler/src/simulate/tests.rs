//! Given a workload, when the policies run against the simulated forge,
//! then these hold.

use std::time::Duration;

use super::forge::State;
use super::runyard::{MESSAGE_JOBS, Mode};
use super::*;

/// A small workload (debug builds run it in well under a second per policy).
fn small(seed: u64) -> SimulateArgs {
    SimulateArgs {
        seed,
        jobs: 600,
        hours: 1.5,
        ..SimulateArgs::default()
    }
}

fn by_name(args: &SimulateArgs, name: &str) -> Box<dyn Scaler> {
    scalers(args)
        .into_iter()
        .find(|s| s.name() == name)
        .unwrap_or_else(|| panic!("no policy {name}"))
}

#[test]
fn with_no_boot_time_and_no_bursts_runyard_never_delays_a_job() {
    let args = SimulateArgs {
        burst_share: 0.0,
        boot: vec![BootSetting::Fixed],
        ..small(3)
    };
    let report = run(&args).unwrap_or_else(|e| panic!("{e}"));
    let ry = report
        .row("fixed", "runyard")
        .unwrap_or_else(|| panic!("no runyard row"));
    assert_eq!(ry.completed, args.jobs);
    assert_eq!(ry.delay.max, 0.0, "scheduling delay of some job");
    assert_eq!(ry.wait.max, 0.0, "queue wait of some job");
    assert_eq!(ry.runners, args.jobs, "one runner per job");
}

#[test]
fn garm_never_creates_a_runner_for_a_job_younger_than_its_backoff() {
    // Lost webhooks and slow boots exercise the unlock paths too.
    let args = SimulateArgs {
        lost_webhooks: 0.05,
        reconcile_period: 60.0,
        ..small(5)
    };
    let work = workload(&args);
    let mut garm = by_name(&args, "garm");
    let (forge, _) = simulate_one(&args, &work, BootSetting::Slow, garm.as_mut());
    let mut checked = 0;
    for r in &forge.runners {
        if let Some(j) = r.made_for {
            let age = r.created_at.saturating_sub(forge.jobs[j].work.queued_at);
            assert!(
                age >= Duration::from_secs(30),
                "runner for job {j} created {age:?} after it was queued"
            );
            checked += 1;
        }
    }
    assert!(checked >= args.jobs, "only {checked} runners made for jobs");
}

#[test]
fn every_job_runs_exactly_once_under_every_policy() {
    let args = small(7);
    let work = workload(&args);
    for boot in [BootSetting::Fast, BootSetting::Slow] {
        for mut scaler in scalers(&args) {
            let (forge, _) = simulate_one(&args, &work, boot, scaler.as_mut());
            let name = scaler.name();
            for (i, j) in forge.jobs.iter().enumerate() {
                assert_eq!(
                    j.starts, 1,
                    "{name}/{boot:?}: job {i} started {} times",
                    j.starts
                );
                assert!(
                    j.completed_at.is_some(),
                    "{name}/{boot:?}: job {i} never completed"
                );
            }
            assert!(forge.quiescent(), "{name}/{boot:?}: runners left behind");
            let ran: usize = forge.runners.iter().filter(|r| r.job.is_some()).count();
            assert_eq!(ran, args.jobs, "{name}/{boot:?}: runners that ran a job");
        }
    }
}

#[test]
fn jobs_are_conserved_with_lost_webhooks_and_failed_creates() {
    let args = SimulateArgs {
        lost_webhooks: 0.05,
        reconcile_period: 60.0,
        create_failures: 0.1,
        ..small(11)
    };
    let work = workload(&args);
    for mut scaler in scalers(&args) {
        let (forge, _) = simulate_one(&args, &work, BootSetting::Slow, scaler.as_mut());
        let name = scaler.name();
        assert!(
            forge.jobs.iter().all(|j| j.starts == 1),
            "{name}: a job ran twice or never"
        );
        assert!(
            forge.jobs.iter().all(|j| j.completed_at.is_some()),
            "{name}: a job never completed"
        );
        // A runner runs at most one job, and only while it exists.
        for r in &forge.runners {
            if let (Some(a), Some(d)) = (r.assigned_at, r.deleted_at) {
                assert!(
                    r.finished_at.is_some_and(|f| a <= f && f <= d),
                    "{name}: {r:?}"
                );
            }
            assert!(r.state != State::Failed || r.job.is_none());
        }
    }
}

#[test]
fn runyard_makes_one_runner_per_job_and_leaves_none_idle() {
    let args = small(13);
    let work = workload(&args);
    let mut ry = by_name(&args, "runyard");
    let (forge, end) = simulate_one(&args, &work, BootSetting::Slow, ry.as_mut());
    let stats = Stats::of("runyard", &forge, end, &flavors(&args));
    assert_eq!(stats.runners, args.jobs);
    assert_eq!(stats.never_ran, 0);
    assert_eq!(stats.create_lag.max, 0.0, "a runner created after its job");
}

#[test]
fn a_seed_gives_the_same_report_every_time() {
    let args = SimulateArgs {
        lost_webhooks: 0.02,
        create_failures: 0.05,
        boot: vec![BootSetting::Slow],
        ..small(17)
    };
    let a = run(&args).unwrap_or_else(|e| panic!("{e}")).to_string();
    let b = run(&args).unwrap_or_else(|e| panic!("{e}")).to_string();
    assert_eq!(a, b);
    let other = run(&SimulateArgs {
        seed: 18,
        ..args.clone()
    })
    .unwrap_or_else(|e| panic!("{e}"))
    .to_string();
    assert_ne!(a, other, "the seed changes nothing");
}

#[test]
fn the_workload_has_the_jobs_and_bursts_asked_for() {
    let args = small(19);
    let work = workload(&args);
    assert_eq!(work.len(), args.jobs);
    assert!(work.windows(2).all(|w| w[0].queued_at <= w[1].queued_at));
    let end = workload::START + Duration::from_secs_f64(args.hours * 3600.0);
    assert!(
        work.iter()
            .all(|w| w.queued_at >= workload::START && w.queued_at <= end)
    );
    let shared = work
        .windows(2)
        .filter(|w| w[0].queued_at == w[1].queued_at)
        .count();
    let bursts = (args.jobs as f64 * args.burst_share) as usize;
    assert!(
        shared + 10 >= bursts && shared <= bursts,
        "{shared} jobs share a queue time, {bursts} asked for in bursts"
    );
    let mut durations: Vec<f64> = work.iter().map(|w| w.duration.as_secs_f64()).collect();
    let median = Percentiles::of(std::mem::take(&mut durations)).p50;
    assert!((240.0..360.0).contains(&median), "median duration {median}");
}

#[test]
fn percentiles_are_nearest_rank() {
    let p = Percentiles::of((1..=100).map(f64::from).collect());
    assert_eq!((p.p50, p.p95, p.p99, p.max), (50.0, 95.0, 99.0, 100.0));
    assert_eq!(Percentiles::of(Vec::new()), Percentiles::default());
}

#[test]
fn with_slow_boots_runyard_adds_no_wait_beyond_booting_and_garm_adds_its_backoff() {
    let args = SimulateArgs {
        lost_webhooks: 0.0,
        boot: vec![BootSetting::Slow],
        ..small(11)
    };
    let report = run(&args).unwrap_or_else(|e| panic!("{e}"));
    let row = |p: &str| {
        report
            .row("slow", p)
            .unwrap_or_else(|| panic!("no {p} row"))
    };
    let (ry, garm) = (row("runyard"), row("garm"));
    assert!(
        ry.beyond_boot.p95 <= 1.0,
        "runyard's wait beyond the n-th boot p95 {}",
        ry.beyond_boot.p95
    );
    assert!(
        garm.beyond_boot.p95 >= 25.0,
        "garm's 30 s back-off shows: p95 {}",
        garm.beyond_boot.p95
    );
    // The per-runner measure credits each job with the boot of whichever
    // runner the forge gave it, so boot-time spread shows up in it.
    assert!(ry.delay.p95 >= ry.beyond_boot.p95);
}

#[test]
fn scale_set_mode_serves_every_job_of_a_small_trace() {
    // Lost webhooks are the webhook mode's: the scale set's messages bring
    // every job all the same, with no reconciler.
    let args = SimulateArgs {
        lost_webhooks: 0.1,
        ..small(23)
    };
    let work = workload(&args);
    for boot in [BootSetting::Fast, BootSetting::Slow] {
        let mut ss = runyard(&args, Mode::ScaleSet);
        let (forge, end) = simulate_one(&args, &work, boot, &mut ss);
        for (i, j) in forge.jobs.iter().enumerate() {
            assert_eq!(j.starts, 1, "{boot:?}: job {i} started {} times", j.starts);
            assert!(
                j.completed_at.is_some(),
                "{boot:?}: job {i} never completed"
            );
        }
        assert!(forge.quiescent(), "{boot:?}: runners left behind");
        let stats = Stats::of(ss.name(), &forge, end, &flavors(&args));
        assert_eq!(stats.runners, args.jobs, "{boot:?}: one runner per job");
        assert_eq!(stats.never_ran, 0, "{boot:?}");
        assert_eq!(stats.create_lag.max, 0.0, "{boot:?}: a runner created late");
        // Assigned, started, completed: three job events a job, in messages
        // of at most 50 (bursts fill some).
        let messages = ss.messages();
        assert_eq!(messages.iter().sum::<usize>(), 3 * args.jobs, "{boot:?}");
        assert!(messages.iter().all(|n| (1..=MESSAGE_JOBS).contains(n)));
        assert!(
            messages.contains(&MESSAGE_JOBS),
            "{boot:?}: no full message"
        );
    }
}

#[test]
fn arc_never_exceeds_max_runners_and_runs_everything_on_the_largest_flavor() {
    let args = SimulateArgs {
        max_runners: 25,
        min_idle: 3,
        create_failures: 0.05,
        ..small(29)
    };
    let work = workload(&args);
    let biggest = largest(&flavors(&args));
    for boot in [BootSetting::Fast, BootSetting::Slow] {
        let mut arc = by_name(&args, "ARC");
        let (forge, _) = simulate_one(&args, &work, boot, arc.as_mut());
        assert!(
            forge.peak() <= 25,
            "{boot:?}: {} runners at once",
            forge.peak()
        );
        assert_eq!(
            forge.peak(),
            25,
            "{boot:?}: the bursts never reached the cap"
        );
        assert!(
            forge.runners.iter().all(|r| r.memory == biggest),
            "{boot:?}: a runner not of the largest flavor"
        );
        assert!(
            forge
                .jobs
                .iter()
                .all(|j| j.starts == 1 && j.completed_at.is_some())
        );
    }
}

#[test]
fn scale_set_and_webhook_mode_differing_only_by_assignment_are_within_10pct() {
    // No lost webhooks (the one input only webhooks see); min_idle keeps
    // several runners idle at once, so which idle runner the forge gives a
    // job (the longest idle, or any of the set's) matters.
    let args = SimulateArgs {
        min_idle: 4,
        ..small(31)
    };
    let report = run(&args).unwrap_or_else(|e| panic!("{e}"));
    for boot in ["fast", "slow"] {
        let row = |p: &str| report.row(boot, p).unwrap_or_else(|| panic!("no {p} row"));
        let (wh, ss) = (row("runyard"), row("runyard scale-set"));
        assert_eq!(ss.completed, args.jobs);
        for (what, a, b, floor) in [
            ("queue wait p50", ss.wait.p50, wh.wait.p50, 0.1),
            ("queue wait p95", ss.wait.p95, wh.wait.p95, 0.1),
            ("runner-min", ss.paid, wh.paid, 1.0),
            ("GiB-min", ss.gib_min, wh.gib_min, 1.0),
            ("idle runner-min", ss.idle, wh.idle, 1.0),
        ] {
            assert!(
                within_10pct(a, b, floor),
                "{boot}: {what} {a} (scale set) vs {b} (webhook)"
            );
        }
    }
    // The assignment did differ.
    let work = workload(&args);
    let (wh, _) = simulate_one(
        &args,
        &work,
        BootSetting::Slow,
        &mut runyard(&args, Mode::Webhook),
    );
    let (ss, _) = simulate_one(
        &args,
        &work,
        BootSetting::Slow,
        &mut runyard(&args, Mode::ScaleSet),
    );
    assert!(
        wh.jobs
            .iter()
            .zip(&ss.jobs)
            .any(|(a, b)| a.runner != b.runner || a.started_at != b.started_at),
        "the two modes ran every job alike"
    );
}
