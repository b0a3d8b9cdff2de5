//! The allocator's quality benchmark: replay a job trace online through the
//! real recommendation code and through gantry's rule, and compare both with
//! the hindsight frontier.
//!
//! For each job in time order the method is asked for a recommendation, then
//! the job's actual peak is revealed. A job whose peak exceeds its limit is
//! OOM-killed (the model observes the attempt with `oom_killed` and the limit
//! as its peak) and retried the way runyard retries: while the workload's
//! consecutive OOM kills (any ref, any job; a success ends them) number at
//! most 3, the kill gets a retry — the same build, so the same need — with
//! the model's next recommendation (its OOM bump; for gantry, which has no
//! retry rule of its own, `max(limit × 1.2, limit + 100 MiB, peak × 1.2)`);
//! the 4th consecutive kill is refused. Retries are observed like first
//! attempts. gantry runs twice: with every job getting up to 3 retries
//! (`gantry (mean of 5; max × 1.2)`), and with the kills counted per
//! workload across jobs as runyard counts them (`gantry, retries counted per
//! workload`) — gantry learns only from successes, so there a workload whose
//! streak ran out keeps its limit and has every later kill refused until a
//! job happens to fit. Metrics count the jobs after a warm-up share of the
//! trace:
//!
//! - **OOM rate**: jobs whose first attempt was killed (peak > limit);
//! - **avg limit slack**: mean `(limit − peak) / limit` over first attempts
//!   that succeeded (comparable with the frontier, which has no retries),
//!   and the same over all successful attempts, retries included;
//! - **avg request slack**: mean `(request − peak) / request` over first
//!   attempts that succeeded;
//! - **retries** spent, **first-retry success** (share of killed jobs whose
//!   first retry succeeded), **failed** jobs (refused a retry);
//! - **mean limit** of first attempts;
//! - the **OOM retries** table: jobs whose first attempt was killed, jobs
//!   that succeeded on retry 1, 2 and 3, jobs refused (count and share of
//!   all jobs), first-retry success over killed first attempts, and the
//!   killed attempts' time and reserved memory·time (as if each was killed
//!   at its end, an upper bound).
//!
//! # Trace CSV
//!
//! A header row, then one job per row; fields may be double-quoted (RFC 4180,
//! no newlines inside fields). Columns, in any order:
//!
//! | column | meaning |
//! |---|---|
//! | `time` | when the job ran: unix seconds or RFC 3339 |
//! | `ref` | the ref it ran on; jobs on `--protected-refs` train the model |
//! | `peak_memory_bytes` | the job's peak memory (what it needs) |
//! | `cpu_seconds` | CPU time used (may be empty) |
//! | `wall_seconds` | wall-clock time (may be empty) |
//! | `workload` | optional: attributes as `k=v;k=v` (e.g. `repo=a/b;workflow=ci;job=test`) |
//! | any other column | a workload attribute named by the header, e.g. `package`, `version`, `variants`, `compiler`, `compiler_version`, `arch`; empty cells are left out |
//!
//! The generator writes `time,package,version,variants,compiler,
//! compiler_version,arch,workload,ref,peak_memory_bytes,cpu_seconds,wall_seconds`.

mod generate;
mod replay;
mod sparse;
mod trace;

use std::fs::File;
use std::io::{BufReader, BufWriter};
use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context as _;
use figment::Figment;
use figment::providers::{Format as _, Serialized, Toml};

pub use generate::{GenConfig, generate};
pub use replay::{
    Band, HISTORY_BUCKETS, LevelOutcome, MAX_RETRIES, OomStreaks, Outcome, PREDICTED_BANDS,
    Retries, RetryScope, frontier, history_buckets, oom_bump, replay_gantry, replay_model,
    replay_model_with,
};
pub use sparse::{SparseConfig, generate_sparse};
pub use trace::{Job, Trace, TraceBuilder, read_csv, write_csv};

use crate::model::Params;

/// How the generator draws each workload's σ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SigmaDistribution {
    /// Log-uniform: most workloads calm, some swinging.
    LogUniform,
    /// Uniform.
    Uniform,
}

/// Which synthetic trace `--generate` makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Profile {
    /// ~67 samples per workload over 42 days (`generate.rs`).
    Dense,
    /// A month in which most workloads are built a handful of times
    /// (`sparse.rs`).
    Sparse,
}

/// The model's memory ceiling for the sparse profile, whose largest builds
/// need up to 120 GB (the default 64 GiB would kill them on every attempt).
pub const SPARSE_CEILING: u64 = 256 << 30;

/// Arguments of `runyard-allocator simulate`.
#[derive(Debug, Clone, clap::Args)]
pub struct SimulateArgs {
    /// Replay this CSV trace (columns in the module docs).
    #[arg(
        long,
        value_name = "FILE.csv",
        required_unless_present = "generate",
        conflicts_with = "generate"
    )]
    pub trace: Option<PathBuf>,
    /// Generate a synthetic trace instead of reading one.
    #[arg(long)]
    pub generate: bool,
    /// Generator: which trace to make.
    #[arg(long, value_enum, default_value_t = Profile::Dense)]
    pub profile: Profile,
    /// Generator: workload streams (package × variants × compiler).
    #[arg(long, default_value_t = 3000)]
    pub workloads: u32,
    /// Generator: jobs [default: 200000 dense, 30000 sparse].
    #[arg(
        long,
        default_value = "200000",
        default_value_if("profile", "sparse", Some("30000")),
        hide_default_value = true
    )]
    pub jobs: u32,
    /// Generator: RNG seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u32,
    /// Generator: smallest per-workload log-normal σ.
    #[arg(long, default_value_t = 0.03)]
    pub sigma_min: f32,
    /// Generator: largest per-workload log-normal σ.
    #[arg(long, default_value_t = 0.45)]
    pub sigma_max: f32,
    /// Generator: how σ is drawn between `--sigma-min` and `--sigma-max`.
    #[arg(long, value_enum, default_value_t = SigmaDistribution::LogUniform)]
    pub sigma_distribution: SigmaDistribution,
    /// Generator: days the trace spans [default: 42 dense, 37 sparse].
    #[arg(
        long,
        default_value = "42",
        default_value_if("profile", "sparse", Some("37")),
        hide_default_value = true
    )]
    pub days: f32,
    /// Generator: share of jobs on pull-request refs [default: 0.3 dense,
    /// 0.25 sparse].
    #[arg(
        long,
        default_value = "0.3",
        default_value_if("profile", "sparse", Some("0.25")),
        hide_default_value = true
    )]
    pub pr_share: f32,
    /// Sparse generator: log-space σ of package sizes.
    #[arg(long, default_value_t = 1.4)]
    pub size_sigma: f32,
    /// Sparse generator: median of package sizes, in GB.
    #[arg(long, value_name = "GB", default_value_t = 1.0)]
    pub size_median: f32,
    /// Sparse generator: share of packages with a new version mid-month.
    #[arg(long, default_value_t = 0.3)]
    pub version_share: f32,
    /// Sparse generator: log-space σ of the size jump of one new version in
    /// four (the others move by σ 0.05).
    #[arg(long, default_value_t = 0.35)]
    pub version_jump: f32,
    /// Generator: share of jobs with a 1.3–2.5× memory spike.
    #[arg(long, default_value_t = 0.005)]
    pub spike_rate: f32,
    /// Generator: mean days between version bumps of a package.
    #[arg(long, default_value_t = 14.0)]
    pub version_every_days: f32,
    /// Generator: log-space random-walk step of a workload's size per day.
    #[arg(long, default_value_t = 0.015)]
    pub drift_per_day: f32,
    /// Generator: share of workloads that first appear during the trace.
    #[arg(long, default_value_t = 0.25)]
    pub new_share: f32,
    /// Share of the trace (first jobs) that only trains, unmeasured.
    #[arg(long, default_value_t = 0.2)]
    pub warmup_fraction: f32,
    /// Instead of `--warmup-fraction`: the jobs of the first this many days
    /// only train [default: 7 for the sparse profile].
    #[arg(long)]
    pub warmup_days: Option<f32>,
    /// Save the generated trace as CSV.
    #[arg(long, value_name = "FILE")]
    pub write_trace: Option<PathBuf>,
    /// Refs whose jobs train the model.
    #[arg(long, value_delimiter = ',', default_value = "develop,main,master")]
    pub protected_refs: Vec<String>,
    /// Model parameters as TOML (the `[model]` table's fields, top-level).
    #[arg(long, value_name = "FILE.toml")]
    pub params: Option<PathBuf>,
    /// Override one model parameter, TOML syntax (`limit_quantile = 0.985`).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// The share of first attempts allowed to be OOM-killed (the model's
    /// `target_oom`, as `RUNYARD_ALLOCATOR_TARGET_OOM` sets it; 0 < X < 0.5).
    #[arg(long, value_name = "X", value_parser = parse_target)]
    pub target_oom: Option<f32>,
    /// Hours from an OOM kill to its retry: other builds of the workload
    /// run (and pass) in between. With it the report adds a row sized the
    /// way runyard did before retries named the attempt they retry (the
    /// workload's OOM streak alone).
    #[arg(long, value_name = "HOURS", default_value_t = 0.0)]
    pub retry_delay_hours: f64,
    /// Sparse generator: share of streams built in two configurations under
    /// one key (a third of their builds need 1.8× the memory).
    #[arg(long, default_value_t = 0.0)]
    pub bimodal_share: f32,
    /// Sparse generator: share of builds that come with 1–3 more builds of
    /// the same spec within six hours.
    #[arg(long, default_value_t = 0.0)]
    pub same_day_share: f32,
    /// Sparse generator: the streams new during the trace appear on this
    /// many days only (0: spread over the month).
    #[arg(long, default_value_t = 0)]
    pub new_package_days: u32,
    /// Sparse generator: how closely a stream's noise follows its build
    /// rate (0–1): rarely built streams are the calm ones.
    #[arg(long, default_value_t = 0.0)]
    pub rare_calm: f32,
}

/// `--target-oom`: a fraction strictly between 0 and 0.5.
fn parse_target(s: &str) -> Result<f32, String> {
    let x: f32 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a number"))?;
    if x.is_finite() && x > 0.0 && x < 0.5 {
        Ok(x)
    } else {
        Err(format!(
            "{s} is not a fraction between 0 and 0.5 (exclusive)"
        ))
    }
}

impl SimulateArgs {
    fn gen_config(&self) -> GenConfig {
        GenConfig {
            workloads: self.workloads as usize,
            jobs: self.jobs as usize,
            seed: u64::from(self.seed),
            sigma_min: wide(self.sigma_min),
            sigma_max: wide(self.sigma_max),
            sigma_log_uniform: self.sigma_distribution == SigmaDistribution::LogUniform,
            days: wide(self.days),
            pr_share: wide(self.pr_share),
            spike_rate: wide(self.spike_rate),
            version_every_days: wide(self.version_every_days),
            drift_per_day: wide(self.drift_per_day),
            new_share: wide(self.new_share),
        }
    }

    fn sparse_config(&self) -> SparseConfig {
        let d = SparseConfig::default();
        SparseConfig {
            workloads: self.workloads as usize,
            jobs: self.jobs as usize,
            seed: u64::from(self.seed),
            days: wide(self.days),
            sigma_min: wide(self.sigma_min),
            sigma_max: wide(self.sigma_max),
            size_sigma: wide(self.size_sigma),
            size_median: wide(self.size_median) * 1e9,
            version_share: wide(self.version_share),
            version_jump: wide(self.version_jump),
            spike_rate: wide(self.spike_rate),
            pr_share: wide(self.pr_share),
            bimodal_share: wide(self.bimodal_share),
            same_day_share: wide(self.same_day_share),
            new_package_days: self.new_package_days,
            rare_calm: wide(self.rare_calm),
            ..d
        }
    }

    fn model_params(&self) -> anyhow::Result<Params> {
        let mut defaults = Params::default();
        if self.generate && self.profile == Profile::Sparse {
            defaults.ceiling_memory_bytes = SPARSE_CEILING;
        }
        let mut figment = Figment::from(Serialized::defaults(defaults));
        if let Some(path) = &self.params {
            figment = figment.merge(Toml::file_exact(path));
        }
        figment = figment.merge(Toml::string(&self.set.join("\n")));
        let mut params: Params = figment.extract().context("invalid model parameters")?;
        if let Some(target) = self.target_oom {
            params.target_oom = wide(target);
        }
        let t = params.target_oom;
        anyhow::ensure!(
            t.is_finite() && (0.0..0.5).contains(&t),
            "target_oom: {t} is not a fraction between 0 (off) and 0.5"
        );
        Ok(params)
    }
}

/// A command-line knob (kept `f32` so the subcommand's arguments stay
/// small) as the `f64` the user typed: `0.03f32` becomes `0.03`, not
/// `0.029999999329447746`.
fn wide(x: f32) -> f64 {
    (f64::from(x) * 1e6).round() / 1e6
}

/// Whether a ref is one of `protected` (`refs/heads/` prefixes ignored).
fn is_protected(git_ref: &str, protected: &[String]) -> bool {
    let short = git_ref.strip_prefix("refs/heads/").unwrap_or(git_ref);
    protected.iter().any(|p| p.trim() == short)
}

/// The comparison of one simulation run.
#[derive(Debug, Clone)]
pub struct Report {
    /// Where the trace came from.
    pub source: String,
    /// Jobs in the trace.
    pub jobs: usize,
    /// Distinct workload keys.
    pub workloads: usize,
    /// Jobs on protected refs.
    pub protected_jobs: usize,
    /// Jobs excluded as warm-up.
    pub warmup: usize,
    /// runyard, gantry (retries counted per job, then per workload as
    /// runyard counts them), then the frontier rows.
    pub rows: Vec<Outcome>,
    /// Seconds the model replay took.
    pub model_seconds: f64,
}

/// How many of a trace's first jobs only train.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Warmup {
    /// This share of the jobs.
    Fraction(f64),
    /// The jobs of the first this many days.
    Days(f64),
}

impl Warmup {
    fn jobs(self, trace: &Trace) -> usize {
        match self {
            Self::Fraction(f) => (trace.jobs.len() as f64 * f.clamp(0.0, 1.0)).round() as usize,
            Self::Days(days) => {
                let first = trace.jobs.first().map_or(0.0, |j| j.at);
                trace
                    .jobs
                    .partition_point(|j| j.at < first + days.max(0.0) * 86_400.0)
            }
        }
    }
}

/// Runs the three methods over `trace`.
pub fn compare(
    trace: &Trace,
    source: String,
    params: Params,
    protected_refs: &[String],
    warmup_fraction: f64,
) -> Report {
    compare_with(
        trace,
        source,
        params,
        protected_refs,
        Warmup::Fraction(warmup_fraction),
        Retries::default(),
    )
}

/// [`compare`] with the warm-up given as a share or in days.
pub fn compare_with(
    trace: &Trace,
    source: String,
    params: Params,
    protected_refs: &[String],
    warmup: Warmup,
    retries: Retries,
) -> Report {
    let protected: Vec<bool> = trace
        .refs
        .iter()
        .map(|r| is_protected(r, protected_refs))
        .collect();
    let warmup = warmup.jobs(trace);
    let ceiling = crate::model::Model::new(params.clone())
        .params()
        .ceiling_memory_bytes;
    let started = Instant::now();
    let model = replay_model_with(trace, &protected, params.clone(), warmup, retries);
    let model_seconds = started.elapsed().as_secs_f64();
    let mut rows = vec![model];
    if retries.delay_s > 0.0 {
        let before = Retries {
            identified: false,
            ..retries
        };
        rows.push(replay_model_with(trace, &protected, params, warmup, before));
    }
    rows.push(replay_gantry(
        trace,
        &protected,
        ceiling,
        warmup,
        RetryScope::Job,
    ));
    rows.push(replay_gantry(
        trace,
        &protected,
        ceiling,
        warmup,
        RetryScope::Workload,
    ));
    for q in [0.95, 0.98, 0.99] {
        rows.push(frontier(trace, &protected, q, ceiling, warmup));
    }
    Report {
        source,
        jobs: trace.jobs.len(),
        workloads: trace.workloads.len(),
        protected_jobs: trace
            .jobs
            .iter()
            .filter(|j| protected[j.git_ref as usize])
            .count(),
        warmup,
        rows,
        model_seconds,
    }
}

fn percent(x: f64) -> String {
    format!("{:.1}%", x * 100.0)
}

impl Report {
    /// The report as markdown: a summary line and the comparison table.
    pub fn markdown(&self) -> String {
        let mut s = format!(
            "Trace: {} — {} jobs, {} workload keys, {:.0}% on protected refs; first {} jobs are warm-up, {} measured. Model replay: {:.1} s.\n\n",
            self.source,
            self.jobs,
            self.workloads,
            100.0 * self.protected_jobs as f64 / self.jobs.max(1) as f64,
            self.warmup,
            self.jobs - self.warmup,
            self.model_seconds,
        );
        s.push_str("| method | OOM rate | avg limit slack | … incl. retries | byte-weighted slack | avg request slack | retries | first-retry success | failed jobs | mean limit |\n");
        s.push_str("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
        for row in &self.rows {
            let (retries, first, failed) = if row.retries_apply {
                (
                    row.retries.to_string(),
                    if row.first_retries > 0 {
                        percent(row.first_retry_success())
                    } else {
                        "—".to_owned()
                    },
                    row.failed.to_string(),
                )
            } else {
                ("—".to_owned(), "—".to_owned(), "—".to_owned())
            };
            s.push_str(&format!(
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.2} GB |\n",
                row.name,
                percent(row.oom_rate()),
                percent(row.avg_limit_slack()),
                percent(row.avg_limit_slack_all()),
                percent(row.byte_slack()),
                percent(row.avg_request_slack()),
                retries,
                first,
                failed,
                row.mean_limit() / 1e9,
            ));
        }
        s.push_str(&self.history_markdown());
        s.push_str(&self.retries_markdown());
        if let Some(model) = self.rows.first().filter(|r| !r.by_level.is_empty()) {
            s.push_str("\nrunyard by ladder level used (first attempts):\n\n| level | jobs | OOM rate | avg limit slack |\n|---|---:|---:|---:|\n");
            for (i, l) in model
                .by_level
                .iter()
                .enumerate()
                .filter(|(_, l)| l.jobs > 0)
            {
                s.push_str(&format!(
                    "| {} | {} | {} | {} |\n",
                    if i == 0 {
                        "none (site prior or defaults)".to_owned()
                    } else {
                        (i - 1).to_string()
                    },
                    l.jobs,
                    percent(l.ooms as f64 / l.jobs as f64),
                    percent(l.slack / (l.jobs - l.ooms).max(1) as f64),
                ));
            }
            s.push_str("\n| samples | jobs | OOM rate | avg limit slack |\n|---|---:|---:|---:|\n");
            let names = ["0 (site prior or defaults)", "1–4", "5–9", "10–19", "20+"];
            for (name, l) in names
                .iter()
                .zip(&model.by_samples)
                .filter(|(_, l)| l.jobs > 0)
            {
                s.push_str(&format!(
                    "| {} | {} | {} | {} |\n",
                    name,
                    l.jobs,
                    percent(l.ooms as f64 / l.jobs as f64),
                    percent(l.slack / (l.jobs - l.ooms).max(1) as f64),
                ));
            }
        }
        s
    }
}

impl Report {
    /// First attempts by the prior protected-ref jobs of the exact workload
    /// key: share of jobs, OOM rate and avg limit slack per method.
    pub fn history_markdown(&self) -> String {
        let mut s = String::from(
            "\nFirst attempts by earlier protected-ref jobs of the exact workload (share of jobs, OOM rate / avg limit slack):\n\n| method |",
        );
        for name in HISTORY_BUCKETS {
            s.push_str(&format!(" {name} |"));
        }
        s.push_str("\n|---|");
        s.push_str(&"---:|".repeat(HISTORY_BUCKETS.len()));
        s.push('\n');
        for row in self
            .rows
            .iter()
            .filter(|r| r.name != "gantry, retries counted per workload")
        {
            s.push_str(&format!("| {} |", row.name));
            for b in &row.by_history {
                s.push_str(&format!(
                    " {:.0}%: {} / {} |",
                    100.0 * b.jobs as f64 / row.jobs.max(1) as f64,
                    percent(b.oom_rate()),
                    percent(b.avg_slack()),
                ));
            }
            s.push('\n');
        }
        for row in self
            .rows
            .iter()
            .filter(|r| r.by_history.iter().any(|b| b.mean_predicted().is_some()))
        {
            s.push_str(&format!(
                "\n{} by history (first attempts; the model's predicted P(OOM) at the limit it gave):\n\n\
                 | prior samples of the exact workload | jobs | OOM | avg slack | first retry succeeds | mean predicted P(OOM) |\n\
                 |---|---:|---:|---:|---:|---:|\n",
                row.name
            ));
            for (name, b) in HISTORY_BUCKETS.iter().zip(&row.by_history) {
                s.push_str(&format!(
                    "| {name} | {} | {} | {} | {} | {} |\n",
                    b.jobs,
                    percent(b.oom_rate()),
                    percent(b.avg_slack()),
                    b.first_retry_rate().map_or("—".to_owned(), percent),
                    b.mean_predicted().map_or("—".to_owned(), percent),
                ));
            }
            s.push_str(&format!(
                "\nCalibration of {}: realized OOM rate / mean predicted P(OOM) of the first attempts in each band of predicted P(OOM) (jobs); in a band with 100 jobs or more the two should agree within ±30% (✓); ≈ marks a band outside it whose kills are still within what chance gives a calibrated prediction (95 % binomial), ✗ one beyond:\n\n| prior samples |",
                row.name
            ));
            let mut lower = 0.0;
            for edge in PREDICTED_BANDS {
                if edge >= 1.0 {
                    s.push_str(&format!(" ≥ {} |", percent(lower)));
                } else {
                    s.push_str(&format!(" {}–{} |", percent(lower), percent(edge)));
                }
                lower = edge;
            }
            s.push_str("\n|---|");
            s.push_str(&"---:|".repeat(PREDICTED_BANDS.len()));
            s.push('\n');
            let mut verdicts = [0usize; 3];
            for (name, b) in HISTORY_BUCKETS.iter().zip(&row.by_history) {
                s.push_str(&format!("| {name} |"));
                for band in &b.bands {
                    if band.jobs == 0 {
                        s.push_str(" — |");
                        continue;
                    }
                    let realized = band.ooms as f64 / band.jobs as f64;
                    let predicted = band.predicted / band.jobs as f64;
                    let mark = if band.jobs < CALIBRATED_BAND_JOBS {
                        ""
                    } else if (realized / predicted - 1.0).abs() <= 0.3 {
                        verdicts[0] += 1;
                        " ✓"
                    } else if binomial_consistent(band.ooms, band.jobs, predicted) {
                        verdicts[1] += 1;
                        " ≈"
                    } else {
                        verdicts[2] += 1;
                        " ✗"
                    };
                    s.push_str(&format!(
                        " {} / {} ({}){mark} |",
                        percent(realized),
                        percent(predicted),
                        band.jobs
                    ));
                }
                s.push('\n');
            }
            s.push_str(&format!(
                "\nBands of {CALIBRATED_BAND_JOBS} jobs or more: {} within ±30%, {} outside it by chance alone, {} beyond chance.\n",
                verdicts[0], verdicts[1], verdicts[2]
            ));
        }
        s
    }

    /// The OOM retry table: what happened to OOM-killed jobs under each
    /// method that retries.
    pub fn retries_markdown(&self) -> String {
        let mut s = String::from(
            "\nOOM retries (a workload's 1st–3rd consecutive OOM kill gets a retry with a bumped limit, the 4th is refused; goal: < 0.1% of jobs refused):\n\n\
             | method | OOM-killed first attempts | ok on retry 1 | ok on retry 2 | ok on retry 3 | refused | refused, % of jobs | first-retry success | retries | killed attempts | killed attempts' hours (≤) | killed share of reserved memory·time (≤) |\n\
             |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        );
        let retrying: Vec<&Outcome> = self.rows.iter().filter(|r| r.retries_apply).collect();
        for row in &retrying {
            s.push_str(&format!(
                "| {} | {} ({:.2}%) | {} | {} | {} | {} | {:.3}% | {} | {} | {} | {:.0} | {:.2}% |\n",
                row.name,
                row.first_ooms,
                100.0 * row.oom_rate(),
                row.ok_on_attempt[1],
                row.ok_on_attempt[2],
                row.ok_on_attempt[3],
                row.failed,
                100.0 * row.refused_rate(),
                if row.first_ooms > 0 {
                    format!("{:.1}%", 100.0 * row.first_retry_success_of_killed())
                } else {
                    "—".to_owned()
                },
                row.retries,
                row.killed_attempts,
                row.killed_seconds / 3600.0,
                100.0 * row.killed_memory_time_share(),
            ));
        }
        for row in retrying.iter().filter(|r| {
            r.refused_after[..MAX_RETRIES as usize]
                .iter()
                .any(|&n| n > 0)
        }) {
            let [none, one, two, three] = row.refused_after;
            s.push_str(&format!(
                "\n{}: refused after 3 retries (the job's own 4th kill) {three}; after 2 {two}, 1 {one}, 0 {none} (the workload's streak ran on from earlier jobs).\n",
                row.name,
            ));
        }
        for row in retrying.iter().filter(|r| r.policy_mismatches > 0) {
            s.push_str(&format!(
                "\n{}: the model disagreed with the retry policy {} times (a retry it did not bump, or a refusal it would have bumped).\n",
                row.name, row.policy_mismatches,
            ));
        }
        s
    }
}

#[allow(clippy::print_stdout)]
fn print(text: &str) {
    println!("{text}");
}

/// Runs `simulate`: loads or generates the trace, replays it, prints the
/// markdown comparison.
pub fn run(args: &SimulateArgs) -> anyhow::Result<()> {
    let params = args.model_params()?;
    let (trace, source) = match &args.trace {
        Some(path) => {
            let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
            let trace = read_csv(BufReader::new(file))
                .with_context(|| format!("reading {}", path.display()))?;
            (trace, path.display().to_string())
        }
        None if args.profile == Profile::Sparse => {
            let config = args.sparse_config();
            let source = format!(
                "generated {}; model ceiling {} GiB",
                config.describe(),
                params.ceiling_memory_bytes >> 30
            );
            (generate_sparse(&config), source)
        }
        None => {
            let config = args.gen_config();
            let trace = generate(&config);
            let source = format!(
                "generated (seed {}, {} workloads, σ {}–{} {}, {} days)",
                config.seed,
                config.workloads,
                config.sigma_min,
                config.sigma_max,
                if config.sigma_log_uniform {
                    "log-uniform"
                } else {
                    "uniform"
                },
                config.days
            );
            (trace, source)
        }
    };
    if let Some(path) = &args.write_trace {
        let file = File::create(path).with_context(|| format!("creating {}", path.display()))?;
        write_csv(&trace, BufWriter::new(file))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    anyhow::ensure!(!trace.jobs.is_empty(), "the trace has no jobs");
    let warmup = match args.warmup_days {
        Some(days) => Warmup::Days(wide(days)),
        None if args.generate && args.profile == Profile::Sparse => Warmup::Days(7.0),
        None => Warmup::Fraction(wide(args.warmup_fraction)),
    };
    let retries = Retries {
        delay_s: args.retry_delay_hours.max(0.0) * 3600.0,
        identified: true,
    };
    let report = compare_with(
        &trace,
        source,
        params,
        &args.protected_refs,
        warmup,
        retries,
    );
    print(&report.markdown());
    Ok(())
}

/// Bands of predicted P(OOM) with this many first attempts are judged.
const CALIBRATED_BAND_JOBS: u64 = 100;

/// Whether `kills` of `n` attempts is within what chance gives attempts
/// each killed with probability `p`: neither tail of Binomial(n, p) beyond
/// `kills` holds less than 2.5 %. A band of 300 attempts at 2 % expects 6
/// kills, and 3 or 10 are as likely as not to come: ±30 % cannot tell a
/// calibrated prediction from a wrong one there, this can.
fn binomial_consistent(kills: u64, n: u64, p: f64) -> bool {
    if !(p > 0.0 && p < 1.0) || n == 0 {
        return (kills == 0) == (p <= 0.0);
    }
    // ln P(X = i), term by term from P(X = 0) = (1 − p)^n.
    let odds = (p / (1.0 - p)).ln();
    let mut ln_pmf = n as f64 * (-p).ln_1p();
    let (mut below, mut above) = (0.0, 0.0);
    for i in 0..=n {
        if i > 0 {
            ln_pmf += ((n - i + 1) as f64 / i as f64).ln() + odds;
        }
        let q = ln_pmf.exp();
        if i <= kills {
            below += q;
        }
        if i >= kills {
            above += q;
        }
    }
    below >= 0.025 && above >= 0.025
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_band_is_judged_against_what_chance_gives() {
        // 300 attempts at 2 %: 6 kills expected; 3 and 10 come by chance.
        for k in [3, 6, 10] {
            assert!(binomial_consistent(k, 300, 0.02), "{k}");
        }
        assert!(!binomial_consistent(0, 300, 0.02));
        assert!(!binomial_consistent(15, 300, 0.02));
        // 10,000 at 3 %: 300 expected; ±30 % is far beyond chance.
        assert!(binomial_consistent(330, 10_000, 0.03));
        assert!(!binomial_consistent(390, 10_000, 0.03));
    }

    #[test]
    fn a_small_generated_trace_compares_all_methods() {
        let config = GenConfig {
            workloads: 200,
            jobs: 20_000,
            ..GenConfig::default()
        };
        let trace = generate(&config);
        let refs = vec!["develop".to_owned()];
        let report = compare(&trace, "test".to_owned(), Params::default(), &refs, 0.2);
        assert_eq!(report.rows.len(), 6);
        assert_eq!(report.warmup, 4000);
        let (model, gantry) = (&report.rows[0], &report.rows[1]);
        assert_eq!(model.jobs, 16_000);
        assert!(model.oom_rate() < gantry.oom_rate(), "{model:?} {gantry:?}");
        assert!(model.first_retry_success() >= 0.9, "{model:?}");
        assert!(model.avg_limit_slack() > 0.0 && model.avg_limit_slack() < 0.6);
        // The frontier tightens as q falls.
        assert!(report.rows[3].avg_limit_slack() < report.rows[5].avg_limit_slack());
        let text = report.markdown();
        assert!(text.contains("| gantry (mean of 5; max × 1.2) |"), "{text}");
        assert!(text.contains("| hindsight q=0.98 |"), "{text}");
        assert!(
            text.contains("| method | OOM-killed first attempts |"),
            "{text}"
        );
        for row in &report.rows[..3] {
            // Every killed first attempt ends on a retry or refused.
            let [first, one, two, three] = row.ok_on_attempt;
            assert_eq!(one + two + three + row.failed, row.first_ooms, "{row:?}");
            assert_eq!(first + row.first_ooms, row.jobs, "{row:?}");
            assert_eq!(row.refused_after.iter().sum::<u64>(), row.failed);
            assert!(row.killed_attempts >= row.first_ooms);
            assert!(row.killed_memory_time_share() > 0.0 && row.killed_memory_time_share() < 1.0);
        }
        assert_eq!(model.policy_mismatches, 0, "{model:?}");
        assert!(model.first_retry_success_of_killed() >= 0.9, "{model:?}");
    }

    #[test]
    fn protected_refs_ignore_the_heads_prefix() {
        let refs = vec!["develop".to_owned(), "main".to_owned()];
        assert!(is_protected("refs/heads/main", &refs));
        assert!(is_protected("develop", &refs));
        assert!(!is_protected("pr-12", &refs));
        assert!(!is_protected("refs/heads/feature", &refs));
    }

    #[test]
    fn knobs_read_as_typed() {
        assert_eq!(wide(0.03), 0.03);
        assert_eq!(wide(0.45), 0.45);
    }

    #[derive(Debug, clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: SimulateArgs,
    }

    #[test]
    fn model_parameters_take_overrides() {
        let cli = <Cli as clap::Parser>::parse_from([
            "simulate",
            "--generate",
            "--set",
            "oom_cost = 3.0",
            "--set",
            "window = 12",
        ]);
        let args = cli.args;
        assert!(args.generate && args.trace.is_none());
        assert_eq!(args.workloads, 3000);
        let params = args.model_params().unwrap();
        assert_eq!((params.oom_cost, params.window), (3.0, 12));
        let bad = SimulateArgs {
            set: vec!["target_oom = 0.7".to_owned()],
            ..args.clone()
        };
        let e = bad.model_params().unwrap_err().to_string();
        assert!(e.contains("target_oom"), "{e}");
        let bad = SimulateArgs {
            set: vec!["no_such_knob = 1".to_owned()],
            ..args
        };
        assert!(bad.model_params().is_err());
    }

    #[test]
    fn the_sparse_profile_has_its_own_defaults_and_a_target_flag() {
        let cli = <Cli as clap::Parser>::parse_from([
            "simulate",
            "--generate",
            "--profile",
            "sparse",
            "--target-oom",
            "0.05",
        ]);
        let args = cli.args;
        assert_eq!((args.jobs, args.days, args.pr_share), (30_000, 37.0, 0.25));
        let params = args.model_params().unwrap();
        assert_eq!(params.target_oom, 0.05);
        assert_eq!(params.ceiling_memory_bytes, SPARSE_CEILING);
        let dense = <Cli as clap::Parser>::parse_from(["simulate", "--generate"]).args;
        assert_eq!((dense.jobs, dense.days), (200_000, 42.0));
        for bad in ["0", "0.5", "x"] {
            let e = <Cli as clap::Parser>::try_parse_from([
                "simulate",
                "--generate",
                "--target-oom",
                bad,
            ])
            .unwrap_err()
            .to_string();
            assert!(e.contains("--target-oom"), "{e}");
        }
    }
}
