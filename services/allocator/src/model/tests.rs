//! Given a history, when asked, then this recommendation.

use proptest::prelude::*;

use super::*;

const T0: f64 = 1_735_689_600.0;
const HOUR: f64 = 3600.0;
const GB: u64 = 1_000_000_000;

fn workload(pairs: &[(&str, &str)]) -> Workload {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// zlib@`version` +shared~pic %gcc@`compiler_version`.
fn zlib(version: &str, compiler_version: &str) -> Workload {
    workload(&[
        ("package", "zlib"),
        ("version", version),
        ("variants", "+shared~pic"),
        ("compiler", "gcc"),
        ("compiler_version", compiler_version),
        ("arch", "linux-ubuntu22.04-x86_64_v3"),
    ])
}

fn ok(at: f64, peak: u64) -> Observation {
    Observation {
        at,
        peak_memory_bytes: peak,
        memory_limit_bytes: Some(peak * 2),
        memory_request_bytes: None,
        cpu_seconds: 250.0,
        wall_seconds: 100.0,
        oom_killed: false,
        protected: true,
        job: None,
    }
}

fn oom(at: f64, limit: u64) -> Observation {
    Observation {
        peak_memory_bytes: limit,
        memory_limit_bytes: Some(limit),
        oom_killed: true,
        ..ok(at, limit)
    }
}

/// `obs` under the limit it ran with (`ok` gives one twice its peak, which
/// no limit set before a job runs could know).
fn ran(obs: Observation, limit: u64) -> Observation {
    Observation {
        memory_limit_bytes: Some(limit),
        ..obs
    }
}

fn unprotected(obs: Observation) -> Observation {
    Observation {
        protected: false,
        ..obs
    }
}

/// A model that has seen `n` builds of `w`, alternating ±2 % around `peak`.
fn trained(w: &Workload, n: usize, peak: u64) -> Model {
    let mut model = Model::new(Params::default());
    train(&mut model, w, n, peak, T0);
    model
}

fn train(model: &mut Model, w: &Workload, n: usize, peak: u64, from: f64) {
    for i in 0..n {
        let wobble = if i % 2 == 0 { 1.02 } else { 0.98 };
        model.observe(w, ok(from + i as f64 * HOUR, (peak as f64 * wobble) as u64));
    }
}

fn now(n: usize) -> f64 {
    T0 + n as f64 * HOUR
}

fn spack_level(level: usize) -> Vec<String> {
    Params::spack_ladder()[level].clone()
}

// ---- defaults and the ladder ----

#[test]
fn no_history_gives_the_defaults() {
    let model = Model::new(Params::default());
    let r = model.recommend(&zlib("1.3", "12.3.0"));
    assert!(r.basis.defaults);
    assert_eq!(r.basis.level, -1);
    assert_eq!(r.basis.samples, 0);
    assert_eq!(r.basis.statistic, "defaults");
    assert_eq!(r.memory_request_bytes, 2 * GB);
    assert_eq!(r.memory_limit_bytes, 5 * GB);
    assert_eq!(r.cpu_request_millicores, 1000);
    // 1 core × 1.5 jobs per core → 2 jobs, a core each.
    assert_eq!(r.build_jobs, 2);
    assert_eq!(r.cpu_limit_millicores, 2000);
    assert_eq!(r.retry_count, 0);
}

#[test]
fn the_most_specific_level_with_enough_samples_is_used() {
    let model = trained(&zlib("1.3", "12.3.0"), 10, GB);
    let r = model.recommend(&zlib("1.3", "12.3.0"));
    assert_eq!((r.basis.level, r.basis.samples), (0, 10));
    assert_eq!(r.basis.matched, spack_level(0));
    assert!(!r.basis.defaults);
    assert!(
        r.basis.statistic.starts_with("lognormal-q"),
        "{}",
        r.basis.statistic
    );

    // A new version: gantry's second level (version dropped).
    let r = model.recommend(&zlib("1.4", "12.3.0"));
    assert_eq!(r.basis.level, 1);
    assert_eq!(r.basis.matched, spack_level(1));
    // A new version and compiler version: the compiler name still matches.
    let r = model.recommend(&zlib("1.4", "13.2.0"));
    assert_eq!(r.basis.level, 3);
    assert_eq!(
        r.basis.matched,
        ["package", "variants", "compiler"]
            .map(String::from)
            .to_vec()
    );
    // Other variants: only the package name.
    let mut other = zlib("1.3", "12.3.0");
    other.insert("variants".into(), "~shared".into());
    let r = model.recommend(&other);
    assert_eq!(r.basis.level, 6);
    assert_eq!(r.basis.matched, vec!["package".to_owned()]);
    // Another package: defaults.
    let mut other = zlib("1.3", "12.3.0");
    other.insert("package".into(), "bzip2".into());
    assert!(model.recommend(&other).basis.defaults);
}

#[test]
fn a_level_needs_min_samples() {
    let w = zlib("1.3", "12.3.0");
    // Two samples and nothing related: not the defaults, but their mean
    // with the pooled spread — wider than ten samples give.
    let two = trained(&w, 2, GB).recommend(&w);
    assert!(!two.basis.defaults, "{two:?}");
    assert_eq!((two.basis.level, two.basis.samples), (0, 2));
    assert!(!two.basis.statistic.ends_with("+shrunk"));
    let ten = trained(&w, 10, GB).recommend(&w);
    assert!(
        two.memory_limit_bytes > ten.memory_limit_bytes * 11 / 10,
        "{two:?} vs {ten:?}"
    );
    assert!(two.memory_limit_bytes < 5 * GB, "{two:?}");

    let params = Params {
        min_samples: 2,
        ..Params::default()
    };
    let mut model = Model::new(params);
    train(&mut model, &w, 2, GB, T0);
    assert_eq!(model.recommend(&w).basis.level, 0);
}

#[test]
fn a_new_version_blends_its_first_samples_into_the_parent() {
    let mut model = trained(&zlib("1.3", "12.3.0"), 12, GB);
    let before = model.recommend(&zlib("1.4", "12.3.0"));
    assert_eq!(before.basis.level, 1);
    // The new version is twice as big: its first sample pulls the location
    // even before it has min_samples of its own.
    model.observe(&zlib("1.4", "12.3.0"), ok(now(12), 2 * GB));
    let after = model.recommend(&zlib("1.4", "12.3.0"));
    assert_eq!(after.basis.level, 1);
    assert!(
        after.basis.statistic.ends_with("+shrunk"),
        "{}",
        after.basis.statistic
    );
    assert!(
        after.memory_request_bytes > before.memory_request_bytes * 13 / 10,
        "{after:?} vs {before:?}"
    );
}

#[test]
fn variants_are_order_insensitive() {
    let model = trained(&zlib("1.3", "12.3.0"), 5, GB);
    let mut reordered = zlib("1.3", "12.3.0");
    reordered.insert("variants".into(), "~pic +shared".into());
    let r = model.recommend(&reordered);
    assert_eq!(r.basis.level, 0);
    assert_eq!(r, model.recommend(&zlib("1.3", "12.3.0")));
}

#[test]
fn a_spec_without_variants_uses_the_spack_ladder() {
    let mut w = zlib("1.3", "12.3.0");
    w.remove("variants");
    let model = trained(&w, 5, GB);
    let r = model.recommend(&w);
    assert_eq!(
        (r.basis.level, r.basis.matched.clone()),
        (0, spack_level(0))
    );
}

#[test]
fn github_workloads_use_their_ladder() {
    let job = workload(&[("repo", "acme/app"), ("workflow", "ci"), ("job", "test")]);
    let model = trained(&job, 5, GB);
    assert_eq!(model.recommend(&job).basis.level, 0);
    // The workflow was renamed: the job name still matches.
    let renamed = workload(&[("repo", "acme/app"), ("workflow", "build"), ("job", "test")]);
    let r = model.recommend(&renamed);
    assert_eq!(r.basis.level, 1);
    assert_eq!(r.basis.matched, ["repo", "job"].map(String::from).to_vec());
    // A new job of the workflow.
    let new_job = workload(&[("repo", "acme/app"), ("workflow", "ci"), ("job", "lint")]);
    assert_eq!(model.recommend(&new_job).basis.level, 2);
}

#[test]
fn workloads_no_ladder_fits_match_on_all_attributes() {
    let w = workload(&[("pipeline", "nightly"), ("step", "docs")]);
    let model = trained(&w, 4, GB);
    let r = model.recommend(&w);
    assert_eq!(r.basis.level, 0);
    assert_eq!(
        r.basis.matched,
        ["pipeline", "step"].map(String::from).to_vec()
    );
    let other = workload(&[("pipeline", "nightly"), ("step", "lint")]);
    assert!(model.recommend(&other).basis.defaults);
}

#[test]
fn only_protected_refs_train() {
    let w = zlib("1.3", "12.3.0");
    let mut model = Model::new(Params::default());
    for i in 0..10 {
        model.observe(&w, unprotected(ok(now(i), 40 * GB)));
    }
    assert!(model.recommend(&w).basis.defaults);
    assert_eq!(model.stats(), (0, 0));
    train(&mut model, &w, 5, GB, now(10));
    let r = model.recommend(&w);
    assert_eq!(r.basis.samples, 5);
    assert!(r.memory_limit_bytes < 2 * GB, "{r:?}");
    assert_eq!(model.stats(), (1, 5));
}

// ---- the statistic ----

#[test]
fn limits_cover_the_history_and_requests_sit_near_typical_use() {
    let w = zlib("1.3", "12.3.0");
    let model = trained(&w, 20, GB);
    let r = model.recommend(&w);
    assert!(r.memory_limit_bytes >= 1_020_000_000, "{r:?}");
    assert!(r.memory_limit_bytes < 1_300_000_000, "{r:?}");
    assert!(
        (980_000_000..=1_030_000_000).contains(&r.memory_request_bytes),
        "{r:?}"
    );
    assert!(r.memory_request_bytes <= r.memory_limit_bytes);
}

#[test]
fn a_wild_workload_gets_more_headroom_than_a_calm_one() {
    let calm = zlib("1.3", "12.3.0");
    let mut wild = zlib("1.3", "12.3.0");
    wild.insert("package".into(), "llvm".into());
    let mut model = Model::new(Params::default());
    let swings = [1.0, 1.6, 0.7, 1.3, 0.8, 1.9, 0.6, 1.1, 1.4, 0.9, 0.75, 1.5];
    for (i, s) in swings.iter().cycle().take(24).enumerate() {
        model.observe(&calm, ok(now(i), GB + (i as u64 % 3) * 10_000_000));
        model.observe(&wild, ok(now(i), (GB as f64 * s) as u64));
    }
    let calm = model.recommend(&calm);
    let wild = model.recommend(&wild);
    let headroom = |r: &Recommendation| r.memory_limit_bytes as f64 / r.memory_request_bytes as f64;
    assert!(headroom(&calm) < 1.15, "{calm:?}");
    assert!(headroom(&wild) > 1.8, "{wild:?}");
    // The newsvendor gives the calm workload the higher quantile.
    let q = |r: &Recommendation| -> f64 {
        r.basis.statistic["lognormal-q".len()..]
            .split('+')
            .next()
            .and_then(|q| q.parse().ok())
            .unwrap_or(0.0)
    };
    assert!(
        q(&calm) > q(&wild),
        "{} vs {}",
        calm.basis.statistic,
        wild.basis.statistic
    );
}

#[test]
fn a_fixed_quantile_can_be_configured() {
    let params = Params {
        target_oom: 0.0,
        oom_cost: 0.0,
        limit_quantile: 0.9,
        ..Params::default()
    };
    let mut model = Model::new(params);
    train(&mut model, &zlib("1.3", "12.3.0"), 10, GB, T0);
    let r = model.recommend(&zlib("1.3", "12.3.0"));
    assert_eq!(r.basis.statistic, "lognormal-q0.900");
}

#[test]
fn one_spike_does_not_inflate_the_limit_for_long() {
    let w = zlib("1.3", "12.3.0");
    let mut model = trained(&w, 20, GB);
    let before = model.recommend(&w).memory_limit_bytes;
    model.observe(&w, ok(now(20), 3 * GB));
    train(&mut model, &w, 2, GB, now(21));
    let after = model.recommend(&w).memory_limit_bytes;
    assert!(after < before * 11 / 10, "{after} vs {before}");
}

#[test]
fn observations_may_arrive_out_of_order() {
    let w = zlib("1.3", "12.3.0");
    let mut in_order = Model::new(Params::default());
    let mut shuffled = Model::new(Params::default());
    let peaks: Vec<u64> = (0..30).map(|i| GB + (i * 7 % 11) * 20_000_000).collect();
    for (i, &p) in peaks.iter().enumerate() {
        in_order.observe(&w, ok(now(i), p));
    }
    for chunk in (0..30).collect::<Vec<_>>().chunks(3) {
        for &i in chunk.iter().rev() {
            shuffled.observe(&w, ok(now(i), peaks[i]));
        }
    }
    let a = in_order.recommend(&w);
    let b = shuffled.recommend(&w);
    // Same window; only the residuals (computed on arrival) may differ.
    let ratio = a.memory_limit_bytes as f64 / b.memory_limit_bytes as f64;
    assert!((0.97..1.03).contains(&ratio), "{a:?} vs {b:?}");
    assert_eq!(a.memory_request_bytes, b.memory_request_bytes);
}

#[test]
fn windows_keep_the_newest_samples() {
    let w = zlib("1.3", "12.3.0");
    let window = Params::default().window;
    let mut model = trained(&w, window, 10 * GB);
    train(&mut model, &w, window, GB, now(window));
    let r = model.recommend(&w);
    assert_eq!(r.basis.samples as usize, window);
    assert!(r.memory_limit_bytes < 2 * GB, "{r:?}");
    // A sample older than the whole window is dropped.
    model.observe(&w, ok(T0 - HOUR, 40 * GB));
    let after = model.recommend(&w);
    assert_eq!(
        (
            after.memory_limit_bytes,
            after.memory_request_bytes,
            after.basis.samples
        ),
        (
            r.memory_limit_bytes,
            r.memory_request_bytes,
            r.basis.samples
        )
    );
}

// ---- OOM rules ----

/// A model with a calm 1 GB history for `w` and its recommendation.
fn calm(w: &Workload) -> (Model, Recommendation) {
    let model = trained(w, 20, GB);
    let r = model.recommend(w);
    (model, r)
}

#[test]
fn a_first_oom_bumps_the_limit_by_a_fifth() {
    let w = zlib("1.3", "12.3.0");
    let (mut model, before) = calm(&w);
    // A pull request's job was killed at 2 GB (OOM streaks count on any ref).
    model.observe(&w, unprotected(oom(now(20), 2 * GB)));
    let r = model.recommend(&w);
    assert_eq!(r.memory_limit_bytes, 2_400_000_000);
    assert_eq!(r.retry_count, 1);
    assert!(r.basis.oom_bump && !r.basis.retries_exhausted);
    assert!(
        r.basis.statistic.ends_with("+oom-bump"),
        "{}",
        r.basis.statistic
    );
    // The request stays the statistic's.
    assert_eq!(r.memory_request_bytes, before.memory_request_bytes);
}

#[test]
fn a_small_limit_gets_at_least_100_mib_more() {
    let w = zlib("1.3", "12.3.0");
    let mut model = trained(&w, 20, 200_000_000);
    model.observe(&w, unprotected(oom(now(20), 300_000_000)));
    let r = model.recommend(&w);
    // 300 MB + 100 MiB = 404.86 MB > 360 MB, rounded up to whole MB.
    assert_eq!(r.memory_limit_bytes, 405_000_000);
}

#[test]
fn a_peak_reported_above_the_limit_gets_a_fifth_more() {
    let w = zlib("1.3", "12.3.0");
    let (mut model, _) = calm(&w);
    let killed = Observation {
        peak_memory_bytes: 3 * GB,
        ..oom(now(20), 2 * GB)
    };
    model.observe(&w, unprotected(killed));
    assert_eq!(model.recommend(&w).memory_limit_bytes, 3_600_000_000);
    // Without a known limit, the peak is the previous limit.
    let mut model = trained(&w, 20, GB);
    let killed = Observation {
        memory_limit_bytes: None,
        ..oom(now(20), 2 * GB)
    };
    model.observe(&w, unprotected(killed));
    assert_eq!(model.recommend(&w).memory_limit_bytes, 2_400_000_000);
}

#[test]
fn the_bump_is_at_least_the_statistic() {
    let w = zlib("1.3", "12.3.0");
    let (mut model, before) = calm(&w);
    // Killed far below what the history says (an old, small limit).
    model.observe(&w, unprotected(oom(now(20), 500_000_000)));
    let r = model.recommend(&w);
    assert!(r.basis.oom_bump);
    assert!(r.memory_limit_bytes >= before.memory_limit_bytes, "{r:?}");
}

#[test]
fn the_second_and_third_ooms_bump_again_and_the_fourth_is_exhausted() {
    let w = zlib("1.3", "12.3.0");
    let (mut model, before) = calm(&w);
    let mut limit = 2 * GB;
    for (n, expected) in [(1, 2_400_000_000), (2, 2_880_000_000), (3, 3_456_000_000)] {
        model.observe(&w, unprotected(oom(now(20) + n as f64, limit)));
        let r = model.recommend(&w);
        assert_eq!(
            (r.memory_limit_bytes, r.retry_count),
            (expected, n),
            "{r:?}"
        );
        assert!(r.basis.oom_bump);
        limit = r.memory_limit_bytes;
    }
    model.observe(&w, unprotected(oom(now(20) + 4.0, limit)));
    let r = model.recommend(&w);
    assert_eq!(r.retry_count, 3);
    assert!(r.basis.retries_exhausted && !r.basis.oom_bump);
    assert!(r.basis.statistic.ends_with("+oom-exhausted"));
    // No bump: the statistic alone (these kills ran on a pull request).
    assert_eq!(r.memory_limit_bytes, before.memory_limit_bytes);
    // A fifth kill changes nothing.
    model.observe(&w, unprotected(oom(now(20) + 5.0, r.memory_limit_bytes)));
    assert_eq!(model.recommend(&w), r);
}

/// Attempt `attempt` of GitHub job `job` (of a run of its own).
fn attempt(job: u64, attempt: u32) -> JobAttempt {
    JobAttempt::new("github", "github.com", job, 0, attempt)
}

/// Attempt `attempt` of GitHub job `job` of run `run`.
fn in_run(run: u64, job: u64, attempt: u32) -> JobAttempt {
    JobAttempt::new("github", "github.com", job, run, attempt)
}

/// `obs` as attempt `a` of job `job`.
fn of(job: u64, a: u32, obs: Observation) -> Observation {
    Observation {
        job: Some(attempt(job, a)),
        ..obs
    }
}

#[test]
fn a_killed_jobs_retry_is_bumped_though_another_build_passed_at_the_same_limit() {
    let w = zlib("1.3", "12.3.0");
    let (mut model, before) = calm(&w);
    let limit = before.memory_limit_bytes;
    // Two builds of the workload at the same limit: job 7 is killed, job 8
    // passes just under it (a pull request each).
    model.observe(&w, unprotected(of(7, 1, oom(now(20), limit))));
    model.observe(
        &w,
        unprotected(of(8, 1, ok(now(20) + 60.0, limit - 10_000_000))),
    );
    // The streak is over: a build that is no retry gets no bump.
    let fresh = model.recommend(&w);
    assert!(!fresh.basis.oom_bump, "{fresh:?}");
    assert!(fresh.memory_limit_bytes < limit * 6 / 5);
    // Job 7's re-run is sized above the limit its attempt 1 was killed at.
    let retry = model.recommend_retry(&w, attempt(7, 1));
    assert!(retry.basis.oom_bump, "{retry:?}");
    assert_eq!(retry.retry_count, 1);
    assert!(
        retry.memory_limit_bytes >= limit * 6 / 5,
        "{} after a kill at {limit}",
        retry.memory_limit_bytes
    );
    // Naming an attempt that was not killed bumps nothing.
    assert!(!model.recommend_retry(&w, attempt(8, 1)).basis.oom_bump);
}

#[test]
fn a_retry_killed_again_is_bumped_from_its_own_limit_until_the_chain_is_spent() {
    let w = zlib("1.3", "12.3.0");
    let (mut model, _) = calm(&w);
    let mut limit = 2 * GB;
    for (n, expected) in [(1, 2_400_000_000), (2, 2_880_000_000), (3, 3_456_000_000)] {
        model.observe(
            &w,
            unprotected(of(7, n, oom(now(20) + f64::from(n), limit))),
        );
        // Other builds pass in between: the workload's streak keeps ending.
        model.observe(&w, unprotected(of(100 + u64::from(n), 1, ok(now(21), GB))));
        let r = model.recommend_retry(&w, attempt(7, n));
        assert_eq!(
            (r.memory_limit_bytes, r.retry_count),
            (expected, n),
            "{r:?}"
        );
        limit = r.memory_limit_bytes;
    }
    model.observe(&w, unprotected(of(7, 4, oom(now(25), limit))));
    let r = model.recommend_retry(&w, attempt(7, 4));
    assert!(r.basis.retries_exhausted && !r.basis.oom_bump, "{r:?}");
}

#[test]
fn a_kill_closes_when_its_job_reports_its_next_attempt() {
    let w = zlib("1.3", "12.3.0");
    let (mut model, _) = calm(&w);
    model.observe(&w, unprotected(of(7, 1, oom(now(20), 2 * GB))));
    model.observe(&w, unprotected(of(7, 2, ok(now(21), 2_200_000_000))));
    // Attempt 2 passed: naming attempt 1 again finds no open kill (and the
    // workload's streak ended with it).
    let r = model.recommend_retry(&w, attempt(7, 1));
    assert!(!r.basis.oom_bump, "{r:?}");
    // Another job's identity is another job: job 9's kill stays open.
    model.observe(&w, unprotected(of(9, 1, oom(now(22), 2 * GB))));
    model.observe(&w, unprotected(of(10, 2, ok(now(23), GB))));
    assert!(model.recommend_retry(&w, attempt(9, 1)).basis.oom_bump);
}

#[test]
fn a_new_build_is_not_bumped_by_another_jobs_open_kill() {
    let w = zlib("1.3", "12.3.0");
    let (mut model, before) = calm(&w);
    let limit = before.memory_limit_bytes;
    model.observe(&w, unprotected(of(7, 1, oom(now(20), limit))));
    // No build passed since: the kill is open, yet a request that retries
    // nothing is sized from the history (which the kill is part of).
    let next = model.recommend(&w);
    assert!(!next.basis.oom_bump && next.retry_count == 0, "{next:?}");
    assert!(next.memory_limit_bytes < limit * 6 / 5, "{next:?}");
    // The same kill unidentified (a caller that cannot say) still bumps
    // the workload's next request, as before.
    let (mut legacy, _) = calm(&w);
    legacy.observe(&w, unprotected(oom(now(20), limit)));
    assert!(legacy.recommend(&w).basis.oom_bump);
}

#[test]
fn a_rerun_under_a_new_job_id_is_found_by_its_run_and_chained() {
    let w = zlib("1.3", "12.3.0");
    let (mut model, _) = calm(&w);
    // Run 500's job is killed at 2 GB; its re-run (attempt 2) has job id
    // 71, the forge's new id for the new attempt.
    let mut limit = 2 * GB;
    let ids = [70, 71, 72, 73];
    for (n, id) in (1..=3).zip(ids) {
        model.observe(
            &w,
            unprotected(Observation {
                job: Some(in_run(500, id, n)),
                ..oom(now(20) + f64::from(n), limit)
            }),
        );
        model.observe(&w, unprotected(of(900 + u64::from(n), 1, ok(now(21), GB))));
        // The scaler names the run and the attempt before (the new job id
        // is all it has of the new attempt).
        let r = model.recommend_retry(&w, JobAttempt::new("github", "github.com", 0, 500, n));
        assert!(r.basis.oom_bump && r.retry_count == n, "attempt {n}: {r:?}");
        assert!(r.memory_limit_bytes >= limit * 6 / 5, "attempt {n}: {r:?}");
        limit = r.memory_limit_bytes;
    }
    // A fourth kill in a row of the same job is its chain's last.
    model.observe(
        &w,
        unprotected(Observation {
            job: Some(in_run(500, ids[3], 4)),
            ..oom(now(25), limit)
        }),
    );
    let r = model.recommend_retry(&w, JobAttempt::new("github", "github.com", 0, 500, 4));
    assert!(r.basis.retries_exhausted && !r.basis.oom_bump, "{r:?}");
    // A pipeline named without an attempt means its latest kill.
    let any = model.recommend_retry(&w, JobAttempt::new("github", "github.com", 0, 500, 0));
    assert!(any.basis.retries_exhausted, "{any:?}");
}

#[test]
fn a_retry_that_passes_teaches_the_overshoot_of_its_own_job() {
    let w = zlib("1.3", "12.3.0");
    let (mut model, _) = calm(&w);
    let before = model.overshoots.total;
    // Killed at 2 GB; another build passes at 1 GB (no lesson about the
    // killed job); then the killed job's retry passes at 2.3 GB.
    model.observe(&w, unprotected(of(7, 1, oom(now(20), 2 * GB))));
    model.observe(&w, unprotected(of(8, 1, ok(now(20) + 10.0, GB))));
    assert!((model.overshoots.total - before).abs() < 1e-6);
    model.observe(&w, unprotected(of(7, 2, ok(now(21), 2_300_000_000))));
    assert!((model.overshoots.total - before - 1.0).abs() < 1e-6);
    // The job's kill is closed now.
    assert!(!model.recommend_retry(&w, attempt(7, 1)).basis.oom_bump);
}

#[test]
fn first_attempts_are_checked_against_their_prediction_by_history_class() {
    let w = zlib("1.3", "12.3.0");
    let (mut model, before) = calm(&w);
    let checked = |m: &Model| {
        m.calibration_checks()
            .iter()
            .map(|c| c.attempts)
            .sum::<u64>()
    };
    let start = checked(&model);
    assert!(start > 0, "the calm history's attempts were checked");
    // Twenty more first attempts of the known workload at its limit, one in
    // two checked; the killed ones count as kills of its class.
    let limit = before.memory_limit_bytes;
    for i in 0..20 {
        let at = now(30) + f64::from(i) * 60.0;
        if i % 5 == 0 {
            model.observe(&w, oom(at, limit));
            model.observe(&w, ok(at + 1.0, limit - 1));
        } else {
            model.observe(&w, ok(at, limit / 2));
        }
    }
    let checks = model.calibration_checks();
    let six_plus = checks[4];
    assert!(checked(&model) - start >= 10, "{checks:?}");
    assert!(six_plus.kills >= 1 && six_plus.kills <= 4, "{checks:?}");
    // Its predictions are probabilities at a limit priced near the target.
    let mean = six_plus.predicted / six_plus.attempts as f64;
    assert!(mean > 0.0 && mean < 0.2, "{checks:?}");
    // A new version of the package is checked in its own class.
    let new = zlib("1.4", "12.3.0");
    let r = model.recommend(&new);
    model.observe(&new, ok(now(40), r.memory_limit_bytes / 2));
    model.observe(&new, ok(now(40) + 1.0, r.memory_limit_bytes / 2));
    assert_eq!(model.calibration_checks()[1].attempts, 1);
}

#[test]
fn a_success_ends_the_streak_and_the_bump_decays_into_the_history() {
    let w = zlib("1.3", "12.3.0");
    let (mut model, before) = calm(&w);
    // Killed on the protected branch at 1.1 GB, then succeeded at 1.2 GB.
    model.observe(&w, oom(now(20), 1_100_000_000));
    let bumped = model.recommend(&w);
    assert!(bumped.basis.oom_bump);
    model.observe(&w, ok(now(21), 1_200_000_000));
    let after = model.recommend(&w);
    assert_eq!(after.retry_count, 0);
    assert!(!after.basis.oom_bump && !after.basis.retries_exhausted);
    // The killed attempt now sits in the history as a censored high value:
    // more headroom than before, less than the bump.
    assert!(
        after.memory_limit_bytes > before.memory_limit_bytes,
        "{after:?} {before:?}"
    );
    assert!(after.memory_limit_bytes < bumped.memory_limit_bytes.max(1_320_000_000));
    // ... and it fades as calm builds follow.
    train(&mut model, &w, 24, GB, now(22));
    let later = model.recommend(&w);
    assert!(
        later.memory_limit_bytes <= before.memory_limit_bytes * 21 / 20,
        "{later:?}"
    );
}

#[test]
fn streaks_follow_time_not_arrival() {
    let w = zlib("1.3", "12.3.0");
    // A kill that happened before the last success arrives late: no streak.
    let (mut model, _) = calm(&w);
    model.observe(&w, unprotected(oom(now(10) + 1.0, 2 * GB)));
    assert_eq!(model.recommend(&w).retry_count, 0);
    // A success that happened before the kill arrives late: still a streak.
    model.observe(&w, unprotected(oom(now(21), 2 * GB)));
    model.observe(&w, unprotected(ok(now(20) + 1.0, GB)));
    assert_eq!(model.recommend(&w).retry_count, 1);
}

#[test]
fn streaks_are_per_full_workload() {
    let w = zlib("1.3", "12.3.0");
    let (mut model, _) = calm(&w);
    model.observe(&w, unprotected(oom(now(20), 2 * GB)));
    // Another arch shares the statistics but not the streak.
    let mut other = w.clone();
    other.insert("arch".into(), "linux-ubuntu22.04-neoverse_v2".into());
    let r = model.recommend(&other);
    assert_eq!(r.retry_count, 0);
    assert_eq!(r.basis.level, 0);
}

#[test]
fn learned_overshoots_raise_the_first_retry() {
    let mut model = Model::new(Params::default());
    // Thirty workloads whose killed jobs needed twice their limit.
    for i in 0..30 {
        let w = zlib(&format!("1.{i}"), "12.3.0");
        model.observe(&w, unprotected(oom(now(i), GB)));
        model.observe(&w, unprotected(ok(now(i) + 1.0, 2 * GB)));
    }
    // A new workload killed at 10 GB: the rule says 12 GB, the learned
    // overshoots say twice the limit.
    let w = zlib("9.9", "12.3.0");
    model.observe(&w, unprotected(oom(now(40), 10 * GB)));
    let r = model.recommend(&w);
    assert!(r.basis.oom_bump);
    assert!(r.memory_limit_bytes >= 20 * GB, "{r:?}");
    assert!(r.memory_limit_bytes <= 20_500_000_000, "{r:?}");
}

#[test]
fn the_ceiling_caps_limits_and_bumps() {
    let params = Params {
        ceiling_memory_bytes: 8 << 30,
        ..Params::default()
    };
    let ceiling = (8u64 << 30) / MB * MB;
    let w = zlib("1.3", "12.3.0");
    let mut model = Model::new(params);
    train(&mut model, &w, 10, 10 * GB, T0);
    let r = model.recommend(&w);
    assert_eq!(r.memory_limit_bytes, ceiling);
    assert!(r.memory_request_bytes <= r.memory_limit_bytes);
    model.observe(&w, unprotected(oom(now(10), ceiling)));
    let r = model.recommend(&w);
    assert!(r.basis.oom_bump);
    assert_eq!(r.memory_limit_bytes, ceiling);
    assert_eq!(model.params().ceiling_memory_bytes, ceiling);
}

// ---- CPU and rounding ----

#[test]
fn cpu_follows_cpu_seconds_over_wall_seconds() {
    let w = zlib("1.3", "12.3.0");
    let mut model = Model::new(Params::default());
    for i in 0..5 {
        let obs = Observation {
            cpu_seconds: 123.0,
            wall_seconds: 100.0,
            ..ok(now(i), 1_234_567_891)
        };
        model.observe(&w, obs);
    }
    let r = model.recommend(&w);
    // 1.23 cores → 1300m; 1.3 × 1.5 → 2 jobs, a core each.
    assert_eq!(r.cpu_request_millicores, 1300);
    assert_eq!(r.build_jobs, 2);
    assert_eq!(r.cpu_limit_millicores, 2000);
    // Memory is rounded up to whole megabytes.
    assert_eq!(r.memory_request_bytes % MB, 0);
    assert_eq!(r.memory_limit_bytes % MB, 0);
    assert_eq!(r.memory_request_bytes, 1_235_000_000);
}

#[test]
fn cpu_is_capped_and_jobs_stay_within_it() {
    let params = Params {
        max_cpu_millicores: 4000,
        ..Params::default()
    };
    let w = zlib("1.3", "12.3.0");
    let mut model = Model::new(params);
    for i in 0..5 {
        let obs = Observation {
            cpu_seconds: 3000.0,
            wall_seconds: 100.0,
            ..ok(now(i), GB)
        };
        model.observe(&w, obs);
    }
    let r = model.recommend(&w);
    assert_eq!(
        (
            r.cpu_request_millicores,
            r.cpu_limit_millicores,
            r.build_jobs
        ),
        (4000, 4000, 4)
    );
    // Unknown CPU (no wall time): the default.
    let other = zlib("2.0", "13.2.0");
    let mut model = Model::new(Params::default());
    for i in 0..5 {
        let obs = Observation {
            wall_seconds: 0.0,
            ..ok(now(i), GB)
        };
        model.observe(&other, obs);
    }
    assert_eq!(model.recommend(&other).cpu_request_millicores, 1000);
}

#[test]
fn requests_never_exceed_limits() {
    // A minimum limit above the typical use, and a ceiling below it.
    let w = zlib("1.3", "12.3.0");
    let params = Params {
        ceiling_memory_bytes: 500 * MB,
        ..Params::default()
    };
    let mut model = Model::new(params);
    train(&mut model, &w, 10, GB, T0);
    let r = model.recommend(&w);
    assert_eq!(
        (r.memory_request_bytes, r.memory_limit_bytes),
        (500 * MB, 500 * MB)
    );
    let params = Params {
        default_memory_bytes: 8 * GB,
        ..Params::default()
    };
    let r = Model::new(params).recommend(&w);
    assert_eq!(r.memory_request_bytes, r.memory_limit_bytes);
}

#[test]
fn params_round_trip_through_toml_names() {
    let json = serde_json::to_value(Params::default()).unwrap();
    let back: Params = serde_json::from_value(json).unwrap();
    assert_eq!(back, Params::default());
    let partial: Params = serde_json::from_str(r#"{"oom_cost": 3.0}"#).unwrap();
    assert_eq!(partial.oom_cost, 3.0);
    assert_eq!(partial.window, Params::default().window);
    assert!(serde_json::from_str::<Params>(r#"{"quantile": 0.9}"#).is_err());
}

#[test]
fn the_model_is_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Model>();
}

// ---- keys ----

#[test]
fn sub_keys_equal_store_keys_of_the_subset() {
    let w = workload(&[
        ("package", "py-numpy"),
        ("version", "1.26.4"),
        ("variants", "~blas+lapack patches=a;b"),
        ("compiler", "gcc"),
        ("compiler_version", "12.3.0"),
        ("arch", "x86_64"),
    ]);
    let full = full_key(&w);
    for level in Params::spack_ladder() {
        let mut cut = String::new();
        sub_key(&full, &level, &mut cut);
        let expected = runyard_store::workload::key(
            level
                .iter()
                .filter_map(|a| w.get_key_value(a))
                .map(|(k, v)| (k.as_str(), v.as_str())),
        );
        assert_eq!(cut, expected);
    }
}

proptest! {
    #[test]
    fn full_keys_equal_store_keys(
        attrs in proptest::collection::btree_map("[ a-z_%;=]{0,8}", "[ -~]{0,16}", 0..7),
        variants in "[ +~a-z=%;]{0,20}",
    ) {
        let mut attrs = attrs;
        attrs.insert("variants".to_owned(), variants);
        let expected = runyard_store::workload::key(attrs.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        prop_assert_eq!(full_key(&attrs), expected);
    }

    #[test]
    fn sub_keys_match_for_any_attributes(
        attrs in proptest::collection::btree_map("[a-z_]{1,8}", "[ -~]{0,12}", 1..6),
        pick in proptest::collection::vec(any::<bool>(), 6),
    ) {
        let full = full_key(&attrs);
        let names: Vec<String> = attrs
            .keys()
            .zip(pick.iter().cycle())
            .filter(|(_, p)| **p)
            .map(|(k, _)| k.clone())
            .collect();
        let mut cut = String::new();
        sub_key(&full, &names, &mut cut);
        let expected = runyard_store::workload::key(
            names
                .iter()
                .filter_map(|a| attrs.get_key_value(a))
                .map(|(k, v)| (k.as_str(), v.as_str())),
        );
        prop_assert_eq!(cut, expected);
    }

    #[test]
    fn recommendations_stay_within_bounds_for_any_history(
        ceiling_gib in 1u64..128,
        max_cpu in 0u64..40_000,
        oom_cost in 0.0f64..10.0,
        min_samples in 0usize..6,
        window in 0usize..6,
        history in proptest::collection::vec(
            (0usize..4, 0u64..100_000_000_000, proptest::option::of(0u64..100_000_000_000),
             any::<bool>(), any::<bool>(), -1e6f64..1e6, -10.0f64..1e5, -1.0f64..1e4),
            0..80,
        ),
        asks in proptest::collection::vec(0usize..5, 1..8),
    ) {
        let params = Params {
            ceiling_memory_bytes: ceiling_gib << 30,
            max_cpu_millicores: max_cpu,
            oom_cost,
            min_samples,
            window,
            ..Params::default()
        };
        let workloads = [
            zlib("1.3", "12.3.0"),
            zlib("1.4", "12.3.0"),
            zlib("1.3", "13.2.0"),
            workload(&[("repo", "a/b"), ("workflow", "ci"), ("job", "t")]),
            workload(&[("x", "y")]),
        ];
        let mut model = Model::new(params);
        for (w, peak, limit, killed, protected, at, cpu, wall) in history {
            model.observe(&workloads[w], Observation {
                at: T0 + at,
                peak_memory_bytes: peak,
                memory_limit_bytes: limit,
                memory_request_bytes: None,
                cpu_seconds: cpu,
                wall_seconds: wall,
                oom_killed: killed,
                protected,
                job: None,
            });
        }
        let p = model.params().clone();
        for w in asks {
            let r = model.recommend(&workloads[w]);
            prop_assert!(r.memory_request_bytes <= r.memory_limit_bytes, "{:?}", r);
            prop_assert!(r.memory_limit_bytes <= p.ceiling_memory_bytes, "{:?}", r);
            prop_assert!(r.memory_limit_bytes >= p.min_memory_bytes, "{:?}", r);
            prop_assert!(r.memory_request_bytes > 0);
            prop_assert!(r.cpu_request_millicores <= r.cpu_limit_millicores, "{:?}", r);
            prop_assert!(r.cpu_limit_millicores <= p.max_cpu_millicores, "{:?}", r);
            prop_assert!(r.build_jobs >= 1);
            prop_assert!(r.retry_count <= p.oom_max_retries);
            prop_assert!(!(r.basis.oom_bump && r.basis.retries_exhausted));
            prop_assert_eq!(r.memory_limit_bytes % MB, 0);
        }
    }
}

// ---- parse_spec, variables, validate ----

#[test]
fn parse_spec_reads_gantry_specs() {
    let w = parse_spec(
        "emacs@29.2 +json+native~treesitter arch=linux-ubuntu22.04-x86_64_v3%gcc@12.3.0",
    )
    .unwrap();
    assert_eq!(w["package"], "emacs");
    assert_eq!(w["version"], "29.2");
    assert_eq!(w["variants"], "+json +native ~treesitter");
    assert_eq!(w["arch"], "linux-ubuntu22.04-x86_64_v3");
    assert_eq!(w["compiler"], "gcc");
    assert_eq!(w["compiler_version"], "12.3.0");
    // Any order of the parts, key=value variants, no variants at all.
    let a = parse_spec("%gcc@12.3.0 cuda_arch=80 ~rocm py-torch@2.3.0 +cuda").unwrap();
    let b = parse_spec("py-torch@2.3.0+cuda~rocm cuda_arch=80 %gcc@12.3.0").unwrap();
    assert_eq!(a, b);
    assert_eq!(a["variants"], "+cuda cuda_arch=80 ~rocm");
    assert!(!a.contains_key("arch"));
    let plain = parse_spec("zlib@=1.3 %clang@17.0.6").unwrap();
    assert_eq!(plain["version"], "1.3");
    assert_eq!(plain["variants"], "");
    assert!(validate(&plain).is_ok());
    let spaced = parse_spec("zlib @1.3 -shared %oneapi@2024.1.0").unwrap();
    assert_eq!(
        (spaced["version"].as_str(), spaced["variants"].as_str()),
        ("1.3", "~shared")
    );
}

#[test]
fn parse_spec_names_what_is_wrong() {
    let cases = [
        ("", "empty"),
        ("zlib %gcc@12", "missing version of \"zlib\""),
        ("zlib@1.3 +shared", "missing compiler"),
        ("zlib@1.3 %gcc", "missing version of compiler"),
        ("@1.3 %gcc@12", "unexpected version"),
        ("zlib@1.3 bzip2@1.0 %gcc@12", "one package per spec"),
        ("zlib@1.3 %gcc@12 %clang@17", "second compiler"),
        (
            "zlib@1.3 ^cmake@3.27 %gcc@12",
            "dependencies are not supported",
        ),
        ("zlib@1.3 ++shared %gcc@12", "invalid variant"),
        ("zlib@1.3 arch= %gcc@12", "empty value"),
        ("zlib@1.3 arch=a arch=b %gcc@12", "second arch"),
        ("zl!b@1.3 %gcc@12", "invalid package name"),
        ("zlib@ %gcc@12", "empty package version"),
        ("+shared %gcc@12", "missing package name"),
    ];
    for (spec, want) in cases {
        let err = parse_spec(spec).unwrap_err().to_string();
        assert!(err.starts_with("spec: "), "{spec:?}: {err}");
        assert!(err.contains(want), "{spec:?}: {err} (want {want:?})");
    }
    assert!(
        parse_spec(&"a".repeat(5000))
            .unwrap_err()
            .to_string()
            .contains("longer than")
    );
}

#[test]
fn variables_use_gantry_units() {
    let r = Recommendation {
        cpu_request_millicores: 1200,
        cpu_limit_millicores: 2000,
        memory_request_bytes: 1_500_000_001,
        memory_limit_bytes: 4_000_000_000,
        build_jobs: 2,
        retry_count: 1,
        basis: Basis {
            samples: 5,
            matched: vec!["package".into()],
            level: 6,
            statistic: "lognormal-q0.980".into(),
            oom_bump: true,
            retries_exhausted: false,
            defaults: false,
            workload_samples: 5,
            oom_probability: Some(0.02),
            spread: Some(0.1),
            site_prior: false,
        },
    };
    let v: BTreeMap<String, String> = variables(&r);
    let expected: BTreeMap<String, String> = [
        ("KUBERNETES_CPU_REQUEST", "1200m"),
        ("KUBERNETES_CPU_LIMIT", "2000m"),
        ("KUBERNETES_MEMORY_REQUEST", "1501M"),
        ("KUBERNETES_MEMORY_LIMIT", "4000M"),
        ("SPACK_BUILD_JOBS", "2"),
        ("RUNYARD_RETRY_COUNT", "1"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    assert_eq!(v, expected);
}

#[test]
fn validate_names_the_offending_field() {
    assert!(validate(&zlib("1.3", "12.3.0")).is_ok());
    let cases: Vec<(Workload, &str)> = vec![
        (Workload::new(), "workload: no attributes"),
        (
            workload(&[("package", "")]),
            "workload.package: empty value",
        ),
        (
            workload(&[("package", "  ")]),
            "workload.package: empty value",
        ),
        (
            workload(&[("variants", "")]),
            "workload: no attribute has a value",
        ),
        (
            workload(&[("pack age", "x")]),
            "workload: invalid attribute name \"pack age\" (letters, digits, '_', '-', '.')",
        ),
        (workload(&[("", "x")]), "workload: empty attribute name"),
        (
            workload(&[(&"n".repeat(65), "x")]),
            "workload: attribute name longer than 64 bytes",
        ),
        (
            workload(&[("package", &"x".repeat(1025))]),
            "workload.package: value longer than 1024 bytes",
        ),
        (
            workload(&[("package", "a\nb")]),
            "workload.package: control character in value",
        ),
    ];
    for (w, want) in cases {
        assert_eq!(validate(&w).unwrap_err().to_string(), want);
    }
    let many: Workload = (0..33).map(|i| (format!("a{i}"), "x".to_owned())).collect();
    assert_eq!(
        validate(&many).unwrap_err().to_string(),
        "workload: 33 attributes, at most 32"
    );
    // Variants may be empty when something else has a value.
    let mut plain = zlib("1.3", "12.3.0");
    plain.insert("variants".into(), String::new());
    assert!(validate(&plain).is_ok());
}

#[test]
fn history_given_by_key_trains_exactly_like_the_attributes() {
    // The projection hands the allocator `workload_key`s at start: a model
    // fed keys answers exactly as one fed the attributes, at every level.
    let versions = [
        zlib("1.3", "12.3.0"),
        zlib("1.3", "13.1.0"),
        zlib("1.4", "12.3.0"),
    ];
    let messy = workload(&[
        ("package", "a;b=c%d"),
        ("variants", "~x+y  z=1"),
        ("version", "2"),
    ]);
    let mut by_attributes = Model::new(Params::default());
    let mut by_key = Model::new(Params::default());
    for i in 0..40 {
        let w = if i % 7 == 6 {
            &messy
        } else {
            &versions[i % versions.len()]
        };
        let obs = if i % 11 == 10 {
            oom(now(i), GB)
        } else {
            ok(now(i), GB + (i as u64 % 5) * 30_000_000)
        };
        by_attributes.observe(w, obs);
        by_key.observe_key(
            &runyard_store::workload::key(w.iter().map(|(k, v)| (k.as_str(), v.as_str()))),
            obs,
        );
    }
    let asked = [
        versions[0].clone(),
        zlib("1.5", "12.3.0"),
        messy.clone(),
        workload(&[("package", "zlib")]),
    ];
    for w in &asked {
        assert_eq!(by_attributes.recommend(w), by_key.recommend(w));
    }
    assert_eq!(by_attributes.stats(), by_key.stats());
}

#[test]
fn the_statistic_names_the_quantile_to_three_decimals() {
    for i in 0..=20_000u32 {
        let q = 0.5 + f64::from(i) / 40_000.0;
        let scaled = q * 1000.0;
        if (scaled - scaled.floor() - 0.5).abs() < 1e-6 {
            continue; // a tie: either neighbour is a fair rounding
        }
        assert_eq!(quantile_statistic(q), format!("lognormal-q{q:.3}"), "{q}");
    }
    assert_eq!(quantile_statistic(0.9999), "lognormal-q1.000");
}

#[test]
fn a_kill_below_the_typical_need_never_trains_the_model_downward() {
    // A calm 1 GB workload is killed at 500 MB (a limit set by hand): the
    // censored sample says "more than 500 MB", which must not pull the
    // typical size towards 550 MB as a plain value would.
    let w = zlib("1.3", "12.3.0");
    // Three samples: too few for outlier clipping to hide the difference.
    let mut model = trained(&w, 3, GB);
    let before = model.recommend(&w);
    model.observe(&w, oom(now(3), GB / 2));
    model.observe(&w, ok(now(4), GB));
    let after = model.recommend(&w);
    assert!(
        after.memory_request_bytes >= before.memory_request_bytes * 99 / 100,
        "{after:?} vs {before:?}"
    );
    // Read as a plain 500 MB value it would have.
    let mut plain = trained(&w, 3, GB);
    plain.observe(&w, ok(now(3), GB / 2));
    plain.observe(&w, ok(now(4), GB));
    let plain = plain.recommend(&w);
    assert!(plain.memory_request_bytes < before.memory_request_bytes * 97 / 100);
}

#[test]
fn a_kill_at_the_limit_trains_as_needing_more() {
    let w = zlib("1.3", "12.3.0");
    let mut model = trained(&w, 8, GB);
    let limit = model.recommend(&w).memory_limit_bytes;
    model.observe(&w, oom(now(8), limit));
    model.observe(&w, ok(now(9), GB));
    // The killed attempt sits above its limit in the window.
    let state = model.workloads.values().next().unwrap();
    let window = &model.windows[state.windows[0] as usize];
    let censored = window
        .samples
        .iter()
        .map(|s| f64::from(s.ln_peak))
        .fold(f64::NEG_INFINITY, f64::max);
    assert!(censored > (limit as f64).ln(), "{censored}");
}

#[test]
fn a_new_version_borrows_from_the_package_with_its_own_uncertainty() {
    let model = trained(&zlib("1.3", "12.3.0"), 12, GB);
    let known = model.recommend(&zlib("1.3", "12.3.0"));
    let new = model.recommend(&zlib("1.4", "12.3.0"));
    assert_eq!((new.basis.level, new.basis.workload_samples), (1, 0));
    assert_eq!(known.basis.workload_samples, 12);
    // Same size, wider: the new version may sit anywhere near the old one.
    assert!(
        new.memory_limit_bytes > known.memory_limit_bytes * 11 / 10,
        "{new:?} vs {known:?}"
    );
    assert!(
        new.memory_request_bytes
            .abs_diff(known.memory_request_bytes)
            < GB / 50
    );
}

#[test]
fn slow_growth_is_followed() {
    // 4 % more every week for 15 weeks: the location follows the recent
    // builds rather than the window's mean.
    let w = zlib("1.3", "12.3.0");
    let mut model = Model::new(Params::default());
    let week = 7.0 * 24.0 * HOUR;
    for i in 0..16 {
        let peak = (GB as f64 * 1.04f64.powi(i)) as u64;
        model.observe(&w, ok(T0 + f64::from(i) * week, peak));
    }
    let latest = GB as f64 * 1.04f64.powi(15);
    let mean = GB as f64 * 1.04f64.powf(7.5);
    let r = model.recommend(&w);
    let request = r.memory_request_bytes as f64;
    assert!(
        request > mean + 0.5 * (latest - mean),
        "{request} vs {latest}"
    );
    assert!(r.memory_limit_bytes as f64 > latest, "{r:?}");
}

#[test]
fn a_spike_kill_bumps_the_retry_but_not_the_weeks_after() {
    let w = zlib("1.3", "12.3.0");
    let mut model = trained(&w, 20, GB);
    let before = model.recommend(&w).memory_limit_bytes;
    // A 3× spike is killed at the limit: the retry is bumped well past it.
    model.observe(&w, oom(now(20), before));
    let retry = model.recommend(&w);
    assert!(retry.basis.oom_bump);
    assert!(retry.memory_limit_bytes >= before * 6 / 5, "{retry:?}");
    model.observe(&w, ok(now(21), 3 * GB));
    // Six ordinary builds later the limit is back near where it was.
    train(&mut model, &w, 6, GB, now(22));
    let after = model.recommend(&w);
    assert!(!after.basis.oom_bump);
    assert!(
        after.memory_limit_bytes < before * 5 / 4,
        "{after:?} vs {before}"
    );
}

#[test]
fn recommendations_state_their_oom_probability_and_samples() {
    let w = zlib("1.3", "12.3.0");
    let model = Model::new(Params::default());
    let r = model.recommend(&w);
    assert_eq!(
        (r.basis.oom_probability, r.basis.workload_samples),
        (None, 0)
    );
    let model = trained(&w, 10, GB);
    let r = model.recommend(&w);
    assert_eq!(r.basis.workload_samples, 10);
    let p = r.basis.oom_probability.unwrap();
    // The quantile the statistic names, up to rounding the limit to MB.
    let q: f64 = r.basis.statistic["lognormal-q".len()..]
        .split('+')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!((p - (1.0 - q)).abs() < 0.004, "{p} vs q {q}");
    // A bumped limit is much safer than the model's own choice.
    let mut model = model;
    model.observe(&w, oom(now(10), r.memory_limit_bytes));
    let bumped = model.recommend(&w);
    assert!(
        bumped.basis.oom_probability.unwrap() < p / 2.0,
        "{bumped:?}"
    );
}

#[test]
fn the_pooled_spread_is_learned_from_all_workloads() {
    // Two samples of a new package: with only calm packages seen, a tight
    // limit; with only wild ones, a wide one. Every job ran with a limit
    // far above its peak, so the tails would learn only that such limits
    // are never killed: the pooled spread is checked alone.
    let pool = |sigma: f64| {
        let mut model = Model::new(Params {
            tail_calibration: false,
            ..Params::default()
        });
        for p in 0..40 {
            let w = workload(&[("package", &format!("p{p}")), ("version", "1")]);
            for i in 0..10 {
                let z = [0.0, 1.0, -1.0, 0.5, -0.5, 1.5, -1.5, 0.2, -0.2, 0.8][i];
                let peak = (GB as f64 * (sigma * z).exp()) as u64;
                model.observe(&w, ran(ok(now(i), peak), 4 * GB));
            }
        }
        let new = workload(&[("package", "new"), ("version", "1")]);
        train(&mut model, &new, 2, GB, now(20));
        model.recommend(&new).memory_limit_bytes
    };
    let (calm, wild) = (pool(0.03), pool(0.4));
    assert!(calm < GB * 13 / 10, "{calm}");
    assert!(wild > calm * 2, "{wild} vs {calm}");
}

/// Runs `jobs` jobs over 200 workloads with spreads 0.03–0.45 through the
/// model, each first asked, then observed; returns the OOM rate of first
/// attempts after the first fifth and the mean limit slack.
fn replay_with_target(target: f64, jobs: usize) -> (f64, f64) {
    let (rate, slack, _) = replay_site(target, jobs, 0.0);
    (rate, slack)
}

/// [`replay_with_target`] on a site where a share `spikes` of jobs needs
/// three times its usual memory; also returns the model.
fn replay_site(target: f64, jobs: usize, spikes: f64) -> (f64, f64, Model) {
    let params = Params {
        target_oom: target,
        ..Params::default()
    };
    let mut model = Model::new(params);
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut uniform = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 11) as f64 / (1u64 << 53) as f64
    };
    let sigmas: Vec<f64> = (0..200)
        .map(|i| 0.03 * 15f64.powf(f64::from(i) / 199.0))
        .collect();
    let (mut asked, mut killed, mut slack) = (0u32, 0u32, 0.0);
    for j in 0..jobs {
        let k = (uniform() * 200.0) as usize % 200;
        let w = workload(&[("package", &format!("p{k}")), ("version", "1")]);
        // Box–Muller.
        let z = (-2.0 * uniform().max(1e-12).ln()).sqrt()
            * (2.0 * std::f64::consts::PI * uniform()).cos();
        let spike = if uniform() < spikes { 3.0 } else { 1.0 };
        let need = (GB as f64 * (1.0 + k as f64 / 50.0) * spike * (sigmas[k] * z).exp()) as u64;
        let r = model.recommend(&w);
        let over = need > r.memory_limit_bytes;
        if j >= jobs / 5 {
            asked += 1;
            if over {
                killed += 1;
            } else {
                slack += 1.0 - need as f64 / r.memory_limit_bytes as f64;
            }
        }
        let at = now(j);
        if over {
            model.observe(&w, oom(at, r.memory_limit_bytes));
            let retry = model.recommend(&w);
            let peak = need.min(retry.memory_limit_bytes);
            let obs = if need > retry.memory_limit_bytes {
                oom(at + 1.0, peak)
            } else {
                ran(ok(at + 1.0, peak), retry.memory_limit_bytes)
            };
            model.observe(&w, obs);
        } else {
            model.observe(&w, ran(ok(at, need), r.memory_limit_bytes));
        }
    }
    (
        f64::from(killed) / f64::from(asked),
        slack / f64::from(asked - killed),
        model,
    )
}

#[test]
fn spikes_no_limit_covers_are_stated_not_chased() {
    // One job in a hundred needs three times its usual memory, whatever
    // its workload: no limit near a calm workload's size covers that.
    let (rate, _, model) = replay_site(0.03, 30_000, 0.01);
    assert!((rate - 0.03).abs() <= 0.3 * 0.03, "realized {rate}");
    // The risk stated for the calmest workloads is never below the spikes'
    // share...
    let calm = model.recommend(&workload(&[("package", "p0"), ("version", "1")]));
    let stated = calm.basis.oom_probability.unwrap_or(0.0);
    assert!(stated >= 0.008, "{stated} for {calm:?}");
    // ... and the kills the model stated for its checked first attempts are
    // the kills there were.
    let (kills, predicted) = model
        .calibration_checks()
        .iter()
        .fold((0.0, 0.0), |(k, p), c| {
            (k + c.kills as f64, p + c.predicted)
        });
    assert!(
        (predicted / kills - 1.0).abs() < 0.2,
        "{predicted} vs {kills}"
    );
}

#[test]
fn the_realized_oom_rate_meets_the_target() {
    for target in [0.01, 0.03, 0.08] {
        let (rate, _) = replay_with_target(target, 20_000);
        assert!(
            (rate - target).abs() <= 0.3 * target,
            "target {target}: realized {rate}"
        );
    }
    // A looser target buys less slack.
    let (_, tight) = replay_with_target(0.01, 8000);
    let (_, loose) = replay_with_target(0.08, 8000);
    assert!(loose < tight - 0.05, "{loose} vs {tight}");
}

#[test]
fn the_target_prices_oom_kills() {
    let w = zlib("1.3", "12.3.0");
    let mut model = trained(&w, 10, GB);
    let cost = model.oom_cost();
    // A run of kills on first attempts, at the limits the model gave:
    // the calibration raises the price.
    for i in 0..600 {
        let other = zlib(&format!("9.{i}"), "12.3.0");
        let limit = model.recommend(&other).memory_limit_bytes;
        model.observe(&other, oom(now(20 + i), limit));
        model.observe(&other, ok(now(20 + i) + 1.0, limit * 2));
    }
    assert!(model.oom_cost() > cost, "{} vs {cost}", model.oom_cost());
}

#[test]
fn reports_that_teach_nothing_leave_no_state_behind() {
    let mut model = Model::new(Params::default());
    // Pull-request builds of 10,000 distinct workloads: nothing trains.
    for i in 0..10_000 {
        model.observe(&zlib(&format!("1.{i}"), "12"), unprotected(ok(now(i), GB)));
    }
    assert_eq!(model.stats(), (0, 0));
    // An OOM kill on any ref is remembered (the next attempt is bumped),
    // and forgotten again once that workload succeeds.
    let w = zlib("9.9", "12");
    model.observe(&w, unprotected(oom(now(1), GB)));
    assert_eq!(model.stats().0, 1);
    assert!(model.recommend(&w).basis.oom_bump);
    model.observe(&w, unprotected(ok(now(2), GB)));
    assert_eq!(model.stats().0, 0);
    assert!(!model.recommend(&w).basis.oom_bump);
}

#[test]
fn the_least_recently_observed_workloads_are_forgotten_past_the_cap() {
    let params = Params {
        max_workloads: 800,
        ..Params::default()
    };
    let mut model = Model::new(params);
    let pkg = package;
    // 5,000 workloads, each observed 6 times, workload i at hour i.
    for i in 0..5_000 {
        train(&mut model, &pkg(i), 6, GB, now(i));
    }
    let (workloads, held) = model.stats();
    assert!(workloads <= 800, "{workloads} workloads kept");
    assert!(
        workloads >= 700,
        "an eviction keeps 7/8 of the cap: {workloads}"
    );
    assert_eq!(model.evicted(), 5_000 - workloads as u64);
    assert_eq!(held, workloads * 6);
    // Windows of forgotten workloads are reused, not accumulated.
    // (seven level keys each: the gantry ladder and the package).
    assert!(
        model.windows.len() <= 800 * 7,
        "{} windows",
        model.windows.len()
    );
    // The newest still answer from their history; the oldest as a package
    // never seen (the site's prior for new packages).
    let newest = model.recommend(&pkg(4_999));
    assert!(!newest.basis.defaults, "{:?}", newest.basis);
    assert_eq!(newest.basis.workload_samples, 6);
    let oldest = model.recommend(&pkg(0));
    assert_eq!(oldest.basis.workload_samples, 0);
    assert!(
        oldest.basis.statistic.ends_with("+newcomer"),
        "{:?}",
        oldest.basis
    );
    // A forgotten workload observed again starts over.
    train(&mut model, &pkg(0), 6, GB, now(6_000));
    assert_eq!(model.recommend(&pkg(0)).basis.workload_samples, 6);
}

/// `pkg-<i>`@1.0 with one variant set and compiler.
fn package(i: usize) -> Workload {
    workload(&[
        ("package", &format!("pkg-{i}")),
        ("version", "1.0"),
        ("variants", "+shared"),
        ("compiler", "gcc"),
        ("compiler_version", "13.2.0"),
    ])
}

/// A model that has seen the first build of `n` packages, sized around
/// `typical` (spread by ±50 % in a fixed pattern).
fn site_of(n: usize, typical: u64) -> Model {
    let mut model = Model::new(Params::default());
    for i in 0..n {
        let factor = [0.5, 0.8, 1.0, 1.25, 1.5][i % 5];
        model.observe(&package(i), ok(now(i), (typical as f64 * factor) as u64));
    }
    model
}

#[test]
fn a_new_package_is_sized_from_the_site_s_other_packages() {
    let never_seen = package(10_000);
    // Too few packages seen: the configured defaults.
    let r = site_of(19, 30 * GB).recommend(&never_seen);
    assert!(r.basis.defaults, "{r:?}");
    assert_eq!(r.memory_limit_bytes, 5 * GB);

    // A site of big builds: a new package is not sent in at 5 GB.
    let big = site_of(40, 30 * GB).recommend(&never_seen);
    assert!(!big.basis.defaults, "{big:?}");
    assert!(big.basis.statistic.ends_with("+newcomer"), "{big:?}");
    assert_eq!((big.basis.level, big.basis.samples), (-1, 0));
    assert!(big.memory_limit_bytes > 30 * GB, "{big:?}");
    let p = big.basis.oom_probability.unwrap();
    assert!(p > 0.0 && p < 0.5, "{p}");
    // A site of small builds: far less than 5 GB.
    let small = site_of(40, 200_000_000).recommend(&never_seen);
    assert!(small.memory_limit_bytes < GB, "{small:?}");
    assert!(small.memory_request_bytes <= small.memory_limit_bytes);
    // A package the model knows is sized from its own samples, not the site.
    let mut model = site_of(40, 30 * GB);
    let w = package(20_000);
    train(&mut model, &w, 5, 100_000_000, now(100));
    let own = model.recommend(&w);
    assert!(!own.basis.statistic.contains("newcomer"), "{own:?}");
    assert!(own.memory_limit_bytes < GB, "{own:?}");
}

#[test]
fn new_github_jobs_are_not_sized_from_spack_packages() {
    let mut model = site_of(40, 30 * GB);
    let repo = |i: usize| workload(&[("repo", &format!("acme/app{i}")), ("job", "test")]);
    let never_seen = repo(10_000);
    // No GitHub job seen yet: the defaults, not the 30 GB packages.
    assert!(model.recommend(&never_seen).basis.defaults);
    for i in 0..40 {
        model.observe(&repo(i), ok(now(100 + i), 300_000_000));
    }
    let r = model.recommend(&never_seen);
    assert!(r.basis.statistic.ends_with("+newcomer"), "{r:?}");
    assert!(r.memory_limit_bytes < 2 * GB, "{r:?}");
    // And the packages' prior is unchanged by the jobs.
    assert!(model.recommend(&package(10_000)).memory_limit_bytes > 30 * GB);
}

#[test]
fn only_a_package_s_first_protected_build_teaches_the_site_prior() {
    let never_seen = package(10_000);
    let before = site_of(40, GB).recommend(&never_seen);
    // Later builds of known packages and pull-request builds of new ones,
    // however big, say nothing about the next new package.
    let mut model = site_of(40, GB);
    for i in 0..40 {
        model.observe(&package(i), ok(now(100 + i), 60 * GB));
        model.observe(&package(500 + i), unprotected(ok(now(200 + i), 60 * GB)));
    }
    assert_eq!(model.recommend(&never_seen), before);
    // New packages killed at their limit teach that newcomers need more
    // than that, never less.
    for i in 0..40 {
        let w = package(1000 + i);
        let limit = model.recommend(&w).memory_limit_bytes;
        model.observe(&w, oom(now(300 + i), limit));
    }
    let after = model.recommend(&never_seen);
    assert!(
        after.memory_limit_bytes > before.memory_limit_bytes,
        "{before:?} → {after:?}"
    );
}

#[test]
fn a_new_version_s_first_retry_covers_how_far_new_versions_overshoot() {
    let version = |i: usize, v: &str| {
        let mut w = package(i);
        w.insert("version".into(), v.into());
        w
    };
    let mut model = Model::new(Params::default());
    let known = package(0);
    train(&mut model, &known, 5, GB, T0);
    // A known workload's kills overshoot by 10 %; the first kills of other
    // packages' new versions turned out to need 3× the limit.
    let mut t = 10;
    for _ in 0..1000 {
        model.observe(&known, oom(now(t), GB));
        model.observe(&known, ok(now(t + 1), 1_100_000_000));
        t += 2;
    }
    for i in 1..=40 {
        train(&mut model, &version(i, "1.0"), 5, GB, now(t));
        model.observe(&version(i, "2.0"), oom(now(t + 5), GB));
        model.observe(&version(i, "2.0"), ok(now(t + 6), 3 * GB));
        t += 7;
    }
    // A new version of a package whose builds were all 1 GB, killed at
    // 1 GB: its retry covers a 3× overshoot.
    train(&mut model, &version(100, "1.0"), 5, GB, now(t));
    model.observe(&version(100, "2.0"), oom(now(t + 5), GB));
    let r = model.recommend(&version(100, "2.0"));
    assert!(r.basis.oom_bump, "{r:?}");
    assert!(r.memory_limit_bytes >= 3 * GB, "{r:?}");
    // The known workload's retry is not inflated by new versions' jumps.
    model.observe(&known, oom(now(t + 6), GB));
    let r = model.recommend(&known);
    assert!(r.basis.oom_bump, "{r:?}");
    assert!(r.memory_limit_bytes < 2 * GB, "{r:?}");
}

// ---- tails learned per history class ----

/// A site where workloads with a second build repeat their first exactly,
/// while the pooled spread is wide (noisy workloads with long histories):
/// the spread prior a second build is priced with is far too wide.
fn calm_second_builds(params: Params) -> (Model, f64) {
    let mut model = Model::new(params);
    let mut at = T0;
    for i in 0..40 {
        let noisy = workload(&[
            ("repo", "acme/noisy"),
            ("workflow", "CI"),
            ("job", &format!("n{i}")),
        ]);
        for j in 0..12u64 {
            at += 60.0;
            let peak = GB + (j % 4) * 300_000_000;
            model.observe(&noisy, ok(at, peak));
        }
    }
    for i in 0..1500 {
        let w = workload(&[
            ("repo", "acme/calm"),
            ("workflow", "CI"),
            ("job", &format!("c{i}")),
        ]);
        if i % 2 == 1 {
            // One more first attempt elsewhere: one first attempt in two
            // is checked, so second builds are checked too.
            at += 60.0;
            let other = workload(&[("repo", "acme/noisy"), ("workflow", "CI"), ("job", "n0")]);
            model.observe(&other, ok(at, GB));
        }
        at += 60.0;
        model.observe(&w, ok(at, 2 * GB));
        // The second build asks, then runs at the limit it was given.
        let r = model.recommend(&w);
        at += 60.0;
        let mut second = ok(at, 2 * GB);
        second.memory_limit_bytes = Some(r.memory_limit_bytes);
        model.observe(&w, second);
    }
    (model, at)
}

#[test]
fn a_class_whose_spread_prior_is_too_wide_learns_it_from_its_record() {
    let fresh = workload(&[("repo", "acme/calm"), ("workflow", "CI"), ("job", "new")]);
    let (mut learned, at) = calm_second_builds(Params::default());
    let (mut raw, _) = calm_second_builds(Params {
        tail_calibration: false,
        ..Params::default()
    });
    for m in [&mut learned, &mut raw] {
        m.observe(&fresh, ok(at + 60.0, 2 * GB));
    }
    let (a, b) = (learned.recommend(&fresh), raw.recommend(&fresh));
    assert_eq!((a.basis.workload_samples, b.basis.workload_samples), (1, 1));
    // No second build ever went beyond its first: the learned tail asks
    // for less headroom at the same stated risk...
    assert!(
        (a.memory_limit_bytes as f64) < 0.95 * b.memory_limit_bytes as f64,
        "{a:?} vs {b:?}"
    );
    // ... and it was right: none of the second builds was killed.
    assert_eq!(learned.calibration_checks()[2].kills, 0);
}

/// Package `i`'s build with variant set `variants`.
fn variant_of(i: usize, variants: &str) -> Workload {
    let mut w = package(i);
    w.insert("variants".into(), variants.into());
    w
}

/// A model that has seen calm builds of one variant set of each of 80
/// packages (1 GB, ±2 %), then the first build of a second variant set
/// of each of the first 60, landing `ratios[i % len]` times the first,
/// each run with the limit the model gave it (a killed one retried).
fn new_variants_landing(ratios: &[f64]) -> Model {
    let mut model = Model::new(Params::default());
    for i in 0..80 {
        train(&mut model, &variant_of(i, "+a"), 8, GB, now(i * 10));
    }
    for (i, ratio) in ratios.iter().cycle().take(60).enumerate() {
        let w = variant_of(i, "+b");
        let peak = (GB as f64 * ratio) as u64;
        let limit = model.recommend(&w).memory_limit_bytes;
        if peak > limit {
            model.observe(&w, oom(now(1000 + i), limit));
        }
        model.observe(&w, ran(ok(now(1000 + i) + 1.0, peak), 3 * peak));
    }
    model
}

#[test]
fn new_workloads_are_priced_by_how_far_new_workloads_landed() {
    // Before any new variant set has landed, one is priced with the
    // configured uncertainty of a fallback.
    let before = new_variants_landing(&[]);
    let fresh = variant_of(70, "+b");
    let prior = before.recommend(&fresh);
    assert_eq!((prior.basis.level, prior.basis.workload_samples), (6, 0));
    // New variant sets of these calm packages landed ±50 % from them:
    // the next one gets a limit that covers that, and states its risk
    // on that spread.
    let far = new_variants_landing(&[1.5, 0.67, 1.25, 0.8, 1.05, 0.95]);
    let wide = far.recommend(&fresh);
    assert!(
        wide.memory_limit_bytes as f64 > prior.memory_limit_bytes as f64 * 1.1,
        "{wide:?} vs {prior:?}"
    );
    assert!(wide.basis.spread.unwrap() > 0.25, "{:?}", wide.basis);
    // Where they landed right on their package, the next is priced
    // closer than the configured uncertainty would.
    let near = new_variants_landing(&[1.01, 0.99, 1.0]);
    let tight = near.recommend(&fresh);
    assert!(
        tight.memory_limit_bytes < prior.memory_limit_bytes,
        "{tight:?} vs {prior:?}"
    );
    // A known variant set is priced as before: its own builds.
    let known = variant_of(70, "+a");
    assert_eq!(
        far.recommend(&known).memory_limit_bytes,
        before.recommend(&known).memory_limit_bytes
    );
}

#[test]
fn new_workloads_that_were_all_killed_are_priced_wider() {
    // Every new variant set's first build was killed at its package's
    // size: all that is known is that they need more.
    let mut model = new_variants_landing(&[]);
    let fresh = variant_of(70, "+b");
    let prior = model.recommend(&fresh);
    for i in 0..60 {
        model.observe(&variant_of(i, "+c"), oom(now(2000 + i), GB));
        model.observe(&variant_of(i, "+c"), ok(now(2000 + i) + 1.0, 2 * GB));
    }
    let after = model.recommend(&fresh);
    assert!(
        after.memory_limit_bytes > prior.memory_limit_bytes,
        "{after:?} vs {prior:?}"
    );
}

#[test]
fn a_workload_priced_by_its_own_heavy_t_is_given_a_lower_quantile() {
    // New workloads of a known package priced by how far such builds
    // landed: a t with 2.5 degrees of freedom, and one nearly normal, of
    // the same scale. The slack of covering the heavy t's far tail is
    // priced as that of the normal with the same 3 % point, so its limit
    // takes more risk than the near-normal one's.
    let model = Model::new(Params::default());
    let estimate = |dof: f64| Estimate {
        mu: (2.0 * GB as f64).ln(),
        sd_pred: 0.2,
        dof,
        cores: None,
        shrunk: false,
        newcomer: false,
        fallback: 1,
        landed: true,
    };
    let class = class_of(false, 0);
    let (heavy, normal) = (estimate(2.5), estimate(400.0));
    let wide = stats::t_quantile(0.97, 2.5) / stats::normal_quantile(0.97);
    let priced = model.effective_spread(class, &heavy);
    assert!((priced / (0.2 * wide) - 1.0).abs() < 1e-9, "{priced}");
    assert!(priced > 0.2 * 1.3, "{priced}");
    let near = model.effective_spread(class, &normal);
    assert!((near / 0.2 - 1.0).abs() < 0.01, "{near}");
    // The quantile the newsvendor chooses at the same cost of a kill.
    let q = |e: &Estimate| {
        stats::normal_probability(stats::newsvendor_z(model.effective_spread(class, e), 2.0))
    };
    assert!(
        q(&heavy) < q(&normal) - 0.005,
        "{} {}",
        q(&heavy),
        q(&normal)
    );
    // And the risk the model states at the heavy one's limit is its t's.
    let z = stats::t_quantile(q(&heavy), 2.5);
    let limit = (heavy.mu + z * heavy.sd_pred).exp();
    let stated = model.oom_probability(class, &heavy, limit);
    assert!((stated / (1.0 - q(&heavy)) - 1.0).abs() < 0.01, "{stated}");
}
