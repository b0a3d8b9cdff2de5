//! What one run measured, and how it is printed.

use std::fmt;
use std::time::Duration;

use super::forge::{Forge, State};
use crate::config::Flavor;
use crate::core::world::Clock;
use crate::sizing::pick_flavor;

/// p50, p95, p99 and max of a sample, in seconds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Percentiles {
    /// Median.
    pub p50: f64,
    /// 95th percentile.
    pub p95: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Largest.
    pub max: f64,
}

impl Percentiles {
    /// Nearest-rank percentiles of `values` (all zero when empty).
    pub fn of(mut values: Vec<f64>) -> Self {
        if values.is_empty() {
            return Self::default();
        }
        values.sort_by(f64::total_cmp);
        let at = |q: f64| {
            let rank = (q * values.len() as f64).ceil() as usize;
            values[rank.clamp(1, values.len()) - 1]
        };
        Self {
            p50: at(0.50),
            p95: at(0.95),
            p99: at(0.99),
            max: values[values.len() - 1],
        }
    }
}

/// One policy under one boot setting.
#[derive(Debug, Clone, PartialEq)]
pub struct Stats {
    /// Policy name.
    pub policy: &'static str,
    /// Jobs in the workload.
    pub jobs: usize,
    /// Jobs that ran to completion.
    pub completed: usize,
    /// Jobs started more than once (must be zero).
    pub started_twice: usize,
    /// Time from queued to taken by a runner, seconds.
    pub wait: Percentiles,
    /// `max(0, wait − boot time of the runner that took the job)`, seconds.
    pub delay: Percentiles,
    /// Jobs with a scheduling delay above 1 s.
    pub delayed: usize,
    /// The wait beyond booting, whichever runner took which job: had the
    /// n-th runner to run a job been created when the n-th job was queued,
    /// the runners would have come online at `queued_n + boot_n`, and the
    /// forge (oldest job first) would have started the n-th job at the
    /// later of its queue time and the n-th of those online times;
    /// `max(0, start − that)`, seconds — the wait the scaler added by
    /// creating runners later than their jobs. Unlike [`Stats::delay`] it
    /// does not depend on which runner the forge gave which job.
    pub beyond_boot: Percentiles,
    /// Jobs that ran on a runner made for another job (`None` when the
    /// policy makes runners for no job in particular).
    pub on_another_jobs_runner: Option<usize>,
    /// `max(0, create time of the n-th runner to run a job − queue time of
    /// the n-th job)`, seconds: how far runner creation trails the queue,
    /// whichever job each runner ends up running.
    pub create_lag: Percentiles,
    /// Σ runner lifetimes (create → delete), minutes.
    pub paid: f64,
    /// Σ runner lifetime × its memory, GiB-minutes.
    pub gib_min: f64,
    /// Runner-minutes paid by memory size: (bytes, minutes), one per
    /// flavor, smallest first.
    pub by_size: Vec<(u64, f64)>,
    /// Jobs that ran on a runner with less memory than the flavor they are
    /// sized for (a runner made for a smaller job took them).
    pub undersized: usize,
    /// Σ time running a job, minutes.
    pub busy: f64,
    /// Σ time online without a job, minutes.
    pub idle: f64,
    /// Σ time from create to online (or to delete), minutes.
    pub booting: f64,
    /// Σ time from the end of the job to the delete, minutes.
    pub teardown: f64,
    /// Runners created (failed creates not included).
    pub runners: usize,
    /// Runners that never ran a job.
    pub never_ran: usize,
    /// Creates that failed.
    pub failed_creates: usize,
    /// Most runners alive at once.
    pub peak: usize,
    /// The policy's own notes on its run.
    pub notes: Vec<String>,
}

fn mins(d: Duration) -> f64 {
    d.as_secs_f64() / 60.0
}

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

fn gib(bytes: u64) -> f64 {
    bytes as f64 / GIB
}

impl Stats {
    /// Measures a finished run with the pool's `flavors`; anything still
    /// alive is counted until `end`.
    pub(crate) fn of(policy: &'static str, forge: &Forge, end: Clock, flavors: &[Flavor]) -> Self {
        let mut wait = Vec::new();
        let mut delay = Vec::new();
        let mut stolen = 0;
        let mut undersized = 0;
        let mut completed = 0;
        let mut started_twice = 0;
        for (i, job) in forge.jobs.iter().enumerate() {
            if job.completed_at.is_some() {
                completed += 1;
            }
            if job.starts > 1 {
                started_twice += 1;
            }
            if let (Some(started), Some(r)) = (job.started_at, job.runner) {
                let w = started.saturating_sub(job.work.queued_at);
                wait.push(w.as_secs_f64());
                delay.push(w.saturating_sub(forge.runners[r].boot).as_secs_f64());
                let own = flavors[pick_flavor(flavors, Some(job.work.memory))]
                    .memory
                    .as_u64();
                if forge.runners[r].memory < own {
                    undersized += 1;
                }
                if forge.runners[r].made_for.is_some_and(|m| m != i) {
                    stolen += 1;
                }
            }
        }
        let delayed = delay.iter().filter(|d| **d > 1.0).count();
        // The same runners, had each been created the moment its job (the
        // n-th runner to run a job, the n-th job queued) was queued: their
        // online times, and when the forge's oldest-first hand-out would
        // then have started each job.
        let mut queued: Vec<(Clock, Clock)> = forge
            .jobs
            .iter()
            .filter_map(|j| Some((j.work.queued_at, j.started_at?)))
            .collect();
        queued.sort_unstable();
        let mut ideal_online: Vec<Clock> = forge
            .runners
            .iter()
            .filter(|r| r.job.is_some())
            .zip(&queued)
            .map(|(r, &(q, _))| q + r.boot)
            .collect();
        ideal_online.sort_unstable();
        let beyond_boot: Vec<f64> = queued
            .iter()
            .zip(&ideal_online)
            .map(|(&(q, started), &on)| started.saturating_sub(q.max(on)).as_secs_f64())
            .collect();
        // Runners that ran a job in creation order, jobs in queue order.
        let create_lag: Vec<f64> = forge
            .runners
            .iter()
            .filter(|r| r.job.is_some())
            .zip(&forge.jobs)
            .map(|(r, j)| r.created_at.saturating_sub(j.work.queued_at).as_secs_f64())
            .collect();
        let mut s = Self {
            policy,
            jobs: forge.jobs.len(),
            completed,
            started_twice,
            wait: Percentiles::of(wait),
            delay: Percentiles::of(delay),
            delayed,
            beyond_boot: Percentiles::of(beyond_boot),
            on_another_jobs_runner: forge
                .runners
                .iter()
                .any(|r| r.made_for.is_some())
                .then_some(stolen),
            create_lag: Percentiles::of(create_lag),
            paid: 0.0,
            gib_min: 0.0,
            by_size: flavors.iter().map(|f| (f.memory.as_u64(), 0.0)).collect(),
            undersized,
            busy: 0.0,
            idle: 0.0,
            booting: 0.0,
            teardown: 0.0,
            runners: 0,
            never_ran: 0,
            failed_creates: 0,
            peak: forge.peak(),
            notes: Vec::new(),
        };
        for r in &forge.runners {
            if r.state == State::Failed {
                s.failed_creates += 1;
                continue;
            }
            s.runners += 1;
            let gone = r.deleted_at.unwrap_or(end);
            let lifetime = mins(gone.saturating_sub(r.created_at));
            s.paid += lifetime;
            s.gib_min += lifetime * gib(r.memory);
            match s.by_size.iter_mut().find(|(m, _)| *m == r.memory) {
                Some((_, m)) => *m += lifetime,
                None => s.by_size.push((r.memory, lifetime)),
            }
            let online = r.online_at.unwrap_or(gone);
            s.booting += mins(online.saturating_sub(r.created_at));
            if let Some(on) = r.online_at {
                s.idle += mins(r.assigned_at.unwrap_or(gone).saturating_sub(on));
            }
            if let Some(a) = r.assigned_at {
                let done = r.finished_at.unwrap_or(gone);
                s.busy += mins(done.saturating_sub(a));
                s.teardown += mins(gone.saturating_sub(done));
            }
            if r.job.is_none() {
                s.never_ran += 1;
            }
        }
        s
    }
}

/// One boot setting's results.
#[derive(Debug, Clone, PartialEq)]
pub struct Section {
    /// `fast`, `slow`, `fixed`.
    pub boot: &'static str,
    /// How boot times are drawn.
    pub label: String,
    /// One row per policy (runyard first).
    pub rows: Vec<Stats>,
}

/// A target from the issue and whether it holds.
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    /// Holds.
    pub pass: bool,
    /// What was checked, with the numbers.
    pub text: String,
}

/// The whole run: parameters, one section per boot setting, the targets.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// `name: value` lines.
    pub params: Vec<(String, String)>,
    /// Per boot setting.
    pub sections: Vec<Section>,
    /// Targets.
    pub targets: Vec<Target>,
}

impl Report {
    /// The row of `policy` under `boot`.
    pub fn row(&self, boot: &str, policy: &str) -> Option<&Stats> {
        self.sections
            .iter()
            .find(|s| s.boot == boot)?
            .rows
            .iter()
            .find(|r| r.policy == policy)
    }
}

fn pct(p: &Percentiles) -> String {
    format!("{:.1} / {:.1} / {:.1}", p.p50, p.p95, p.p99)
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "# Scaler simulation")?;
        writeln!(f)?;
        for (k, v) in &self.params {
            writeln!(f, "- {k}: {v}")?;
        }
        for s in &self.sections {
            writeln!(f)?;
            writeln!(f, "## {} boots ({})", s.boot, s.label)?;
            writeln!(f)?;
            writeln!(
                f,
                "| policy | jobs run | queue wait p50 / p95 / p99 (s) | scheduling delay p50 / p95 / p99 (s) | jobs delayed > 1 s | wait beyond the n-th boot p50 / p95 / p99 (s) | create lag p50 / p95 / p99 (s) | runner-min paid | GiB-min paid | busy | idle | booting | after the job | runners | never ran a job | peak |"
            )?;
            writeln!(
                f,
                "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
            )?;
            for r in &s.rows {
                writeln!(
                    f,
                    "| {} | {}/{} | {} | {} | {} | {} | {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {} | {} | {} |",
                    r.policy,
                    r.completed,
                    r.jobs,
                    pct(&r.wait),
                    pct(&r.delay),
                    r.delayed,
                    pct(&r.beyond_boot),
                    pct(&r.create_lag),
                    r.paid,
                    r.gib_min,
                    r.busy,
                    r.idle,
                    r.booting,
                    r.teardown,
                    r.runners,
                    r.never_ran,
                    r.peak,
                )?;
            }
            if let Some(first) = s.rows.first() {
                writeln!(f)?;
                writeln!(f, "Runner-minutes paid by memory size:")?;
                writeln!(f)?;
                let sizes: Vec<String> = first
                    .by_size
                    .iter()
                    .map(|(m, _)| format!("{} GiB", gib(*m)))
                    .collect();
                writeln!(
                    f,
                    "| policy | {} | GiB-min | mean GiB per runner-min | jobs on a runner smaller than their size |",
                    sizes.join(" | ")
                )?;
                writeln!(f, "|---|{}---:|---:|---:|", "---:|".repeat(sizes.len()))?;
                for r in &s.rows {
                    let cells: Vec<String> = first
                        .by_size
                        .iter()
                        .map(|(m, _)| {
                            let v = r.by_size.iter().find(|(n, _)| n == m).map_or(0.0, |x| x.1);
                            format!("{v:.0}")
                        })
                        .collect();
                    writeln!(
                        f,
                        "| {} | {} | {:.0} | {:.2} | {} |",
                        r.policy,
                        cells.join(" | "),
                        r.gib_min,
                        r.gib_min / r.paid.max(f64::MIN_POSITIVE),
                        r.undersized
                    )?;
                }
            }
            writeln!(f)?;
            for r in &s.rows {
                let mut notes = r.notes.clone();
                if let Some(n) = r.on_another_jobs_runner {
                    notes.push(format!(
                        "{n} jobs ({:.1}%) ran on a runner made for another job",
                        100.0 * n as f64 / r.jobs.max(1) as f64
                    ));
                }
                if r.failed_creates > 0 {
                    notes.push(format!("{} creates failed", r.failed_creates));
                }
                if r.started_twice > 0 {
                    notes.push(format!("{} jobs started twice", r.started_twice));
                }
                if !notes.is_empty() {
                    writeln!(f, "- {}: {}", r.policy, notes.join("; "))?;
                }
            }
        }
        writeln!(f)?;
        writeln!(f, "## Targets")?;
        writeln!(f)?;
        for t in &self.targets {
            writeln!(f, "- {} {}", if t.pass { "PASS" } else { "FAIL" }, t.text)?;
        }
        writeln!(f)?;
        writeln!(
            f,
            "queue wait: from `queued` to the job starting on a runner. scheduling delay: \
             queue wait − boot time (create → online) of the runner that ran the job, floored \
             at 0, i.e. the time the job waited beyond what booting its runner took (late \
             creates, waiting behind an idle runner, a runner taken by another job). \
             wait beyond the n-th boot: start of the n-th job in queue order − when it would have \
             started had the n-th runner that ran a job been created the moment that job was queued \
             (same boot times, the forge giving the oldest job to the first runner online), floored \
             at 0: the wait the scaler added, without crediting a job with the boot of the runner \
             the forge happened to give it. \
             create lag: create time of the n-th runner that ran a job − queue time of the n-th \
             job, floored at 0 (how far runner creation trails the queue, whichever job each runner ends up \
             running). runner-min paid: Σ (delete − create) over all runners = booting + idle + busy + \
             after the job (a finished runner not yet deleted). GiB-min paid: Σ (delete − create) × \
             the runner's memory. idle: online without a job. jobs on a runner smaller than their \
             size: the runner that ran the job has less memory than the flavor the job is sized for \
             (a runner made for a smaller job took it; OOM kills are not simulated)."
        )
    }
}
