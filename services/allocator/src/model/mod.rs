//! The recommendation maths: CPU and memory for the next job of a workload
//! from the history of the same workload.
//!
//! # Matching
//!
//! A workload is a map of attributes. A *ladder* is a list of attribute sets,
//! most specific first; the first configured ladder whose top level's
//! attributes are all in the workload is used (`variants` counts as present
//! when absent: a Spack spec without variants is common), otherwise the
//! workload's own attributes form a one-level ladder. The most specific level
//! whose key holds at least `min_samples` samples is used; with none, the
//! configured defaults are. Keys are [`runyard_store::workload::key`], so
//! variants are order-insensitive. `arch` is not in the default Spack ladder:
//! the memory of a build barely depends on the micro-architecture, and keying
//! on it would split the history of every package that is built for two.
//!
//! # The statistic
//!
//! Each level key keeps a bounded window of its most recent protected-ref
//! samples (16 bytes each): time, `ln(peak)`, cores used, and the sample's
//! one-step-ahead residual — how far it landed from the most specific
//! level's location just before it arrived, scaled by `1/√(1 + 1/n)` so its
//! square estimates σ². Residuals measure the spread *within* a workload even
//! at a level that mixes versions or variants.
//!
//! A recommendation models the next `ln(peak)` as Student-t:
//!
//! - **location** μ: the recency-weighted mean (half-lives in samples and in
//!   days) of the base level's values after clipping outliers at 3 robust σ
//!   (median/MAD), so a spike or a censored value does not drag it;
//! - **spread** σ²: the weighted mean square of the base level's clipped
//!   residuals, shrunk towards the parent level's residual σ (the next level
//!   with enough samples; else the spread pooled over all workloads — a
//!   running mean of every workload's clipped squared residuals, `prior_sigma`
//!   until 50 are in), worth `parent_prior_weight` (`prior_weight`) samples;
//! - **few samples**: with no level holding `min_samples`, the most specific
//!   level's one or two samples give the location, the pooled spread σ, and
//!   the t distribution `prior_weight` degrees of freedom — wide, but not
//!   the configured defaults;
//! - **nothing on the ladder** (a new package): the site's prior for
//!   newcomers — mean and spread of the first need of every earlier new
//!   package (recent ones weighing more, a censored first build counted as
//!   its expected need above its limit), once 20 are in; before that the
//!   configured defaults; one prior per ladder (Spack packages and GitHub
//!   jobs differ). The quantile is priced like any other estimate,
//!   so the answer says `…+newcomer` and gives its P(OOM);
//! - **fallback**: when the base is not the most specific level (a new
//!   version, compiler or variant set), the location is uncertain by
//!   `max(fallback_sigma², the level's spread beyond its residuals)` more, and
//!   the few samples a more specific level already has pull it their way
//!   (precision-weighted);
//! - **how far new workloads landed** ([`landing`]): once 30 first builds
//!   of workloads priced from the same kind of fallback (ladder, level, and
//!   whether more specific samples pulled the location) are in, a new
//!   workload of that kind is priced by them instead: a Student t fitted by
//!   maximum likelihood to how far the last 512 landed from where they were
//!   placed (killed ones censored at their limit), its scale then set so
//!   that their own limits would have been passed as often as they were,
//!   and at least half the level's own predictive spread. It is their
//!   record already, so no class tail is laid over it; the newsvendor
//!   weighs its slack as that of the normal with the t's 3 % point (for
//!   a t with 2.5 degrees of freedom, 1.75 times its scale). A new
//!   variant set of a calm package lands as far from it as variant sets
//!   sit apart, however calm each is; `fallback_sigma` only covers the
//!   start;
//! - **predictive** sd `√(σ² + Var μ)` (with `Var μ = σ²/n` for n effective
//!   samples) and t degrees of freedom from the residual count plus the prior.
//!
//! - **the tail the site realized** (`tail_calibration`, [`tail`]): per
//!   history class, spread and ladder depth, a fit of where recent first
//!   attempts' peaks fell on this predictive scale (their upper tail, OOM
//!   kills censored), with a share of peaks far beyond it (spikes, jumps)
//!   that no limit near it covers, each group drawn towards its history
//!   class's pooled fit; quantiles and P(OOM) are read from it, so a class
//!   the priors make too wide or too sure is priced by what happened, and
//!   the newsvendor weighs slack on the spread it realized. Each class
//!   restates the risk its limits are read at by what its recent limits
//!   realized (a logistic shift and slope about 2 %), so its lowest and
//!   highest stated risks are not the ones its noisiest spreads give.
//!
//! The memory limit is the predictive quantile that minimises expected
//! slack plus λ × P(OOM): a newsvendor choice in which calm workloads get
//! high quantiles (covering their tail is cheap) and wild ones lower
//! (covering theirs would waste memory on every run), kept within
//! `[min_quantile, max_quantile]`. λ is the Lagrange multiplier that makes
//! the share of OOM-killed first attempts meet `target_oom` at the least
//! mean slack (`target.rs`: solved from recent first attempts' spreads,
//! corrected by the kills seen); with `target_oom = 0` it is the fixed
//! `oom_cost`, and with both 0 every workload gets `limit_quantile`. The
//! answer states the predicted P(OOM) of the limit it returns (after any
//! bump or clamp) and the exact workload's samples. The memory request is the median `exp(μ)`. The CPU
//! request is the recency-weighted mean of `cpu_seconds / wall_seconds`;
//! `build_jobs` is the request in cores times `build_jobs_per_core`, and the
//! CPU limit gives those jobs a core each.
//!
//! An OOM-killed attempt's need is unknown (it was more than its limit), so
//! it trains as its expected need given that: the predictive distribution's
//! mean above the limit, never below the limit or the location (a kill never
//! trains the model downward); `max(peak, limit) × censored_factor` when
//! there is no estimate yet.
//!
//! # OOM kills
//!
//! Per full workload key (all attributes), the model counts consecutive
//! OOM-killed attempts on any ref. While the streak is 1..=`oom_max_retries`
//! the next limit is at least `max(limit × 1.2, limit + 100 MiB, peak × 1.2)`
//! of the latest killed attempt, and — the rule says "at least" — also at
//! least the fit's `retry_quantile` and the share `retry_coverage` of the
//! overshoots the model has seen: how far killed jobs exceeded their first
//! limit (learned from streaks that ended in a success, given the streak has
//! ruled out everything below the latest limit) — for a workload killed
//! before it had a sample of its own (a new version or package), the larger
//! of that and the same share of new workloads' overshoots, which jump
//! further. So the first retry clears a spike instead of creeping up on it
//! in 20 % steps. A longer streak gets
//! no bump (`retries_exhausted`, `retry_count` stays at the maximum). A
//! successful attempt ends the streak; from then on the recommendation is the
//! statistic again, whose window holds the killed attempt as a censored
//! value: the bump decays into the history instead of staying forever.
//!
//! Limits never exceed `ceiling_memory_bytes`, requests never exceed limits;
//! memory is rounded up to whole megabytes (10^6 bytes, gantry's unit) and CPU
//! up to 100 millicores.

mod keys;
mod landing;
mod oom;
mod ring;
mod spec;
mod stats;
mod tail;
mod target;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap};
use std::sync::OnceLock;

use keys::{KeyHasher, escape_name, select_ladder};
pub(crate) use keys::{full_key, sub_key};
use landing::Landings;
use oom::{Killed, Overshoots, Streak};
pub use spec::{parse_spec, validate, variables};
use stats::{Fit, FitKnobs, Sample};
use tail::{ClassTails, Shape};
use target::Calibration;

/// A workload: attribute name → value (`package`, `version`, `variants`,
/// `compiler`, `compiler_version`, `arch` for Spack; `repo`, `workflow`, `job`
/// for GitHub).
pub type Workload = BTreeMap<String, String>;

/// One mebibyte.
pub const MIB: u64 = 1 << 20;
/// One megabyte, the unit memory is rounded to (gantry's `M`).
pub const MB: u64 = 1_000_000;
/// CPU values are rounded up to this many millicores.
pub const CPU_STEP_MILLICORES: u64 = 100;
/// The OOM rule's factor on the previous limit and on the observed peak.
pub const OOM_FACTOR: f64 = 1.2;
/// The OOM rule's addition to the previous limit.
pub const OOM_ADD_BYTES: u64 = 100 * MIB;

/// The attribute holding Spack variants, which may be absent.
const VARIANTS: &str = "variants";

/// Tunables of the recommendation; part of the allocator's TOML config.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Params {
    /// CPU request without history (gantry: 1 core).
    pub default_cpu_millicores: u64,
    /// Memory request without history (gantry: 2 GB).
    pub default_memory_bytes: u64,
    /// Memory limit without history (gantry: 5 GB).
    pub default_memory_limit_bytes: u64,
    /// The largest node's memory: no limit exceeds it.
    pub ceiling_memory_bytes: u64,
    /// The smallest memory limit ever recommended.
    pub min_memory_bytes: u64,
    /// The largest CPU request or limit (and `build_jobs` in cores).
    pub max_cpu_millicores: u64,
    /// Samples a ladder level needs before it is used.
    pub min_samples: usize,
    /// Candidate ladders of attribute sets, most specific level first.
    pub ladders: Vec<Vec<Vec<String>>>,
    /// Consecutive OOM kills that get a bumped limit; one more gets none.
    pub oom_max_retries: u32,
    /// Samples kept per level key, the most recent by time (at most 64).
    pub window: usize,
    /// Weight half-life in samples (0 = no count decay).
    pub half_life_samples: f64,
    /// Residual (σ) weight half-life in samples (0 = no count decay).
    pub sigma_half_life_samples: f64,
    /// Weight half-life in days of age (0 = no time decay).
    pub half_life_days: f64,
    /// Share of first attempts the operator accepts to see OOM-killed
    /// (`RUNYARD_ALLOCATOR_TARGET_OOM`, 0 < t < 0.5). The cost of an OOM kill
    /// becomes a Lagrange multiplier, solved so that the mean predicted
    /// P(OOM) of recent first attempts meets the target and corrected slowly
    /// by the OOM kills actually seen; `oom_cost` is only its starting value.
    /// 0 = off: a fixed `oom_cost`.
    pub target_oom: f64,
    /// Cost of an OOM kill in units of a job's limit, against which the
    /// slack of every run is weighed (2: the killed attempt and the larger
    /// retry each reserve about a run's worth): each recommendation takes the
    /// quantile that minimises expected slack + `oom_cost` × P(OOM) for the
    /// workload's spread (calm workloads get high quantiles, wild ones lower).
    /// 0 = use `limit_quantile` for every workload.
    pub oom_cost: f64,
    /// The quantiles the cost-optimal choice is kept between.
    pub min_quantile: f64,
    /// See `min_quantile`.
    pub max_quantile: f64,
    /// Fixed predictive quantile of the next peak, when `target_oom` and
    /// `oom_cost` are 0.
    pub limit_quantile: f64,
    /// Extra margin on the memory limit (0.05 = +5 %).
    pub limit_margin: f64,
    /// Prior log-space σ of a workload's peaks when no parent level has
    /// enough samples.
    pub prior_sigma: f64,
    /// Weight of that prior σ in pseudo-samples.
    pub prior_weight: f64,
    /// Weight of the parent level's residual σ (the next less specific level
    /// with enough samples), used as the prior when there is one.
    pub parent_prior_weight: f64,
    /// Log-space σ of how far a workload's typical size may sit from the
    /// level it falls back to (a new version, compiler or variant): added to
    /// the location's uncertainty when the most specific level lacks samples,
    /// until 30 first builds of new workloads of that kind have landed and
    /// price the next ones instead.
    pub fallback_sigma: f64,
    /// Outliers (spikes, censored OOM values) are clipped at this many robust
    /// standard deviations (median/MAD) before the fit; 0 = off.
    pub clip: f64,
    /// Windows with fewer samples are not clipped.
    pub clip_min_samples: usize,
    /// An OOM-killed attempt trains as `max(peak, limit) × censored_factor`.
    pub censored_factor: f64,
    /// Predictive quantile a bumped (retry) limit covers at least.
    pub retry_quantile: f64,
    /// Share of past overshoots (how far killed jobs exceeded their first
    /// limit, learned from retries that then succeeded) a bumped limit
    /// covers at least; 0 = off.
    pub retry_coverage: f64,
    /// `build_jobs` per requested core: a parallel build averages fewer busy
    /// cores than it has make jobs (configure, link and serial phases), so
    /// jobs = cores × this keeps the cores-used feedback loop from shrinking.
    pub build_jobs_per_core: f64,
    /// State P(OOM) and choose limits by the tail each history class has
    /// realized ([`tail`]), not by the predictive distribution alone.
    pub tail_calibration: bool,
    /// Most workloads (full keys) the model keeps state for
    /// (`RUNYARD_ALLOCATOR_MAX_WORKLOADS`); past it, the least recently
    /// observed eighth is forgotten, with the level windows only they used.
    pub max_workloads: usize,
}

fn ladder(levels: &[&[&str]]) -> Vec<Vec<String>> {
    levels
        .iter()
        .map(|level| level.iter().map(|a| (*a).to_owned()).collect())
        .collect()
}

/// The six levels gantry matches a Spack job at, most specific first
/// (dropping compiler version, version, compiler).
pub(crate) const GANTRY_LEVELS: [&[&str]; 6] = [
    &[
        "package",
        "variants",
        "version",
        "compiler",
        "compiler_version",
    ],
    &["package", "variants", "compiler", "compiler_version"],
    &["package", "variants", "version", "compiler"],
    &["package", "variants", "compiler"],
    &["package", "variants", "version"],
    &["package", "variants"],
];

impl Params {
    /// gantry's six levels ([`GANTRY_LEVELS`]) and then the package name
    /// alone.
    pub fn spack_ladder() -> Vec<Vec<String>> {
        let mut levels = GANTRY_LEVELS.to_vec();
        levels.push(&["package"]);
        ladder(&levels)
    }

    /// A GitHub job by repository, workflow and job name; a renamed workflow
    /// keeps its job names, and a new job starts from its workflow's jobs.
    pub fn github_ladder() -> Vec<Vec<String>> {
        ladder(&[
            &["repo", "workflow", "job"],
            &["repo", "job"],
            &["repo", "workflow"],
        ])
    }
}

impl Default for Params {
    fn default() -> Self {
        Self {
            default_cpu_millicores: 1000,
            default_memory_bytes: 2_000_000_000,
            default_memory_limit_bytes: 5_000_000_000,
            ceiling_memory_bytes: 64 << 30,
            min_memory_bytes: 64 * MB,
            max_cpu_millicores: 16_000,
            min_samples: 3,
            ladders: vec![Self::spack_ladder(), Self::github_ladder()],
            oom_max_retries: 3,
            window: 48,
            half_life_samples: 12.0,
            sigma_half_life_samples: 48.0,
            half_life_days: 21.0,
            target_oom: 0.03,
            oom_cost: 2.0,
            min_quantile: 0.75,
            max_quantile: 0.9995,
            limit_quantile: 0.98,
            limit_margin: 0.0,
            prior_sigma: 0.2,
            prior_weight: 3.0,
            parent_prior_weight: 4.0,
            fallback_sigma: 0.15,
            clip: 3.0,
            clip_min_samples: 6,
            censored_factor: 1.1,
            retry_quantile: 0.999,
            retry_coverage: 0.95,
            build_jobs_per_core: 1.5,
            tail_calibration: true,
            max_workloads: 200_000,
        }
    }
}

/// One finished attempt of a job.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Observation {
    /// When it finished, unix seconds.
    pub at: f64,
    /// Peak memory (for an OOM kill: the usage at the kill).
    pub peak_memory_bytes: u64,
    /// The limit the job ran with.
    pub memory_limit_bytes: Option<u64>,
    /// The request the job ran with.
    pub memory_request_bytes: Option<u64>,
    /// CPU time used.
    pub cpu_seconds: f64,
    /// Wall-clock time.
    pub wall_seconds: f64,
    /// Whether the attempt was OOM-killed.
    pub oom_killed: bool,
    /// Whether it ran on a protected ref (the caller decides); only these
    /// train the statistics, OOM streaks count on any ref.
    pub protected: bool,
    /// The job attempt it was, when the report names it: a kill stays open
    /// for that job's retry until the job reports a later attempt.
    pub job: Option<JobAttempt>,
}

/// One attempt of one job, hashed: the job's identity, the pipeline (GitHub
/// run) it ran in, and the attempt. Either identity may be unknown (0).
///
/// A GitHub re-run starts a new run attempt of the same run, and a GitLab
/// job retry is a new job of the same pipeline with its retries counted
/// up, so two attempts of one job (of one workload) share a pipeline even
/// where the forge gives the new attempt a new job id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct JobAttempt {
    /// A hash of the forge, its instance and the forge's job id; 0 unknown.
    pub job: u64,
    /// A hash of the forge, its instance and the pipeline / run id; 0
    /// unknown.
    pub pipeline: u64,
    /// The attempt, from 1 (GitHub `run_attempt`; GitLab retries + 1); 0
    /// in a request that names a pipeline only: its latest killed attempt.
    pub attempt: u32,
}

/// Links of retry pipelines kept, at most (all are forgotten past it; the
/// next start's load reads them again from the projection).
const RETRIED_PIPELINES_KEPT: usize = 65_536;

/// A forge-scoped id hashed (0 stays 0: unknown). Forge and instance
/// compare without case, hashed byte by byte (no lower-cased copies: the
/// start-up load hashes two ids a row).
fn scoped(kind: u8, forge: &str, instance: &str, id: u64) -> u64 {
    use std::hash::Hasher as _;
    if id == 0 {
        return 0;
    }
    let mut h = std::hash::DefaultHasher::new();
    h.write_u8(kind);
    for part in [forge, instance] {
        for b in part.bytes() {
            h.write_u8(b.to_ascii_lowercase());
        }
        h.write_u8(0xff);
    }
    h.write_u64(id);
    h.finish().max(1)
}

/// The hashed identity of pipeline (GitHub run) `id` of `forge` at
/// `instance`, as [`JobAttempt::pipeline`] holds it.
fn pipeline_key(forge: &str, instance: &str, id: u64) -> u64 {
    scoped(b'p', forge, instance, id)
}

impl JobAttempt {
    /// Attempt `attempt` of job `job_id` of `forge` (`github`, `gitlab`)
    /// at `instance` (host names compare without case), in pipeline (GitHub
    /// run) `pipeline_id`; an id of 0 is unknown.
    pub fn new(forge: &str, instance: &str, job_id: u64, pipeline_id: u64, attempt: u32) -> Self {
        Self {
            job: scoped(b'j', forge, instance, job_id),
            pipeline: pipeline_key(forge, instance, pipeline_id),
            attempt,
        }
    }

    /// Whether `self` is an earlier attempt of the job `later` is an
    /// attempt of: the same job id, or the same pipeline.
    pub(crate) fn precedes(&self, later: &Self) -> bool {
        let same = (self.job != 0 && self.job == later.job)
            || (self.pipeline != 0 && self.pipeline == later.pipeline);
        same && self.attempt < later.attempt
    }

    /// Whether a request naming `asked` retries this attempt: the same
    /// attempt of the same job or pipeline (any attempt in the pipeline
    /// when `asked` names none).
    pub(crate) fn answers(&self, asked: &Self) -> bool {
        let job = asked.job != 0 && asked.job == self.job;
        let pipeline = asked.pipeline != 0 && asked.pipeline == self.pipeline;
        (job || pipeline) && (asked.attempt == 0 || asked.attempt == self.attempt)
    }

    /// [`JobAttempt::new`] from what a caller sent, each part checked and
    /// refused by its name under `field` (`retry_of.forge`, ...): a job id
    /// with its attempt, or a pipeline id (with or without an attempt).
    pub fn checked(
        field: &str,
        forge: &str,
        instance: &str,
        job_id: u64,
        pipeline_id: u64,
        attempt: u32,
    ) -> Result<Self, runyard_events::FieldError> {
        use runyard_events::FieldError;
        if runyard_events::parse_forge(forge).is_none() {
            return Err(FieldError::new(
                format!("{field}.forge"),
                format!("{forge:?} is not a forge (github or gitlab)"),
            ));
        }
        runyard_events::limits::text(&format!("{field}.instance"), instance)?;
        if instance.trim().is_empty() {
            return Err(FieldError::new(
                format!("{field}.instance"),
                "empty (the forge's host, e.g. github.com)",
            ));
        }
        if job_id == 0 && pipeline_id == 0 {
            return Err(FieldError::new(
                format!("{field}.job_id"),
                "neither a job id nor a pipeline id: name the attempt retried",
            ));
        }
        if job_id != 0 && attempt == 0 {
            return Err(FieldError::new(
                format!("{field}.attempt"),
                "0 with a job id: attempts count from 1",
            ));
        }
        Ok(Self::new(forge, instance, job_id, pipeline_id, attempt))
    }
}

/// Names of the history classes first attempts are checked in (metric
/// label values): priced from the site's prior for new packages; a known
/// package's workload with no sample of its own; 1–2, 3–5 and 6 or more
/// samples of its own.
pub const HISTORY_CLASSES: [&str; 5] = [
    "new_package",
    "new_workload",
    "samples_1_2",
    "samples_3_5",
    "samples_6_plus",
];

/// Upper bounds of the predictive spreads (log-space sd) whose tails are
/// learned apart within a history class: calm and wild workloads miss
/// their tails differently.
const SPREAD_GROUPS: [f64; 4] = [0.07, 0.12, 0.2, 0.35];

/// Tails learned per history class: by spread, and by how far down the
/// ladder the estimate stands (its own level; one or two levels down, a
/// new version or compiler; further, the package as a whole).
const SPREADS: usize = SPREAD_GROUPS.len() + 1;

/// The tail group of an estimate: its spread group and ladder depth.
fn tail_group(e: &Estimate) -> (usize, usize) {
    let spread = SPREAD_GROUPS.iter().filter(|&&b| e.sd_pred >= b).count();
    let depth = match e.fallback {
        0 => 0,
        1..=2 => 1,
        _ => 2,
    };
    (spread, depth)
}

/// The history class of an estimate: the site's prior (`newcomer`), else by
/// the `exact` workload's own samples.
fn class_of(newcomer: bool, exact: usize) -> usize {
    match (newcomer, exact) {
        (true, _) => 0,
        (false, 0) => 1,
        (false, 1..=2) => 2,
        (false, 3..=5) => 3,
        _ => 4,
    }
}

/// First attempts of one history class checked against the P(OOM) the
/// model predicted at the limit they ran with: a calibrated model's kills
/// match the sum of its predictions.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CalibrationCheck {
    /// First attempts checked (one in two with a limit and an estimate).
    pub attempts: u64,
    /// ... that were OOM-killed.
    pub kills: u64,
    /// Σ of the P(OOM) predicted for them.
    pub predicted: f64,
}

/// How a recommendation was made.
#[derive(Debug, Clone, PartialEq)]
pub struct Basis {
    /// Samples at the level used (0 = defaults).
    pub samples: u32,
    /// Attribute names of the level used.
    pub matched: Vec<String>,
    /// Level index in the ladder (0 = most specific), -1 for defaults.
    pub level: i32,
    /// The statistic and the quantile it chose, e.g. `lognormal-q0.987`,
    /// `defaults`; `+shrunk`, `+oom-bump`, `+oom-exhausted` when they apply.
    pub statistic: String,
    /// The memory limit was bumped after an OOM kill.
    pub oom_bump: bool,
    /// The workload used up its bumped retries.
    pub retries_exhausted: bool,
    /// No level had enough samples; defaults were used.
    pub defaults: bool,
    /// Samples of the exact workload (all attributes) the model holds.
    pub workload_samples: u32,
    /// The predicted probability that the next peak exceeds the returned
    /// memory limit; `None` for configured defaults (nothing to predict
    /// from).
    pub oom_probability: Option<f64>,
    /// The predictive standard deviation of ln(peak) the limit was priced
    /// with; `None` for configured defaults.
    pub spread: Option<f64>,
    /// The estimate is the site's prior for workloads new to it.
    pub site_prior: bool,
}

/// Resources for the next job of a workload.
#[derive(Debug, Clone, PartialEq)]
pub struct Recommendation {
    /// CPU request.
    pub cpu_request_millicores: u64,
    /// CPU limit.
    pub cpu_limit_millicores: u64,
    /// Memory request (≤ the limit).
    pub memory_request_bytes: u64,
    /// Memory limit (≤ the ceiling).
    pub memory_limit_bytes: u64,
    /// Parallel build jobs.
    pub build_jobs: u32,
    /// Consecutive OOM kills of this workload (at most `oom_max_retries`).
    pub retry_count: u32,
    /// How it was made.
    pub basis: Basis,
}

/// The recommendation model: bounded per-level sample windows and OOM
/// streaks, all in memory. `Send + Sync`; `recommend` is a pure read.
#[derive(Debug)]
pub struct Model {
    params: Params,
    knobs: FitKnobs,
    /// `params.ladders` with names escaped as in keys.
    escaped: Vec<Vec<Vec<String>>>,
    hasher: KeyHasher,
    /// Level keys by index hash: (check hash, index into `windows`).
    levels: HashMap<u64, (u64, u32)>,
    /// Per level key: the most recent samples and their fit.
    windows: Vec<Window>,
    /// Workloads (full keys) by index hash.
    workloads: HashMap<u64, WorkloadState>,
    /// How far killed jobs overshot their first limit (all workloads).
    overshoots: Overshoots,
    /// The overshoots of kills of workloads that had no sample of their own
    /// (also in `overshoots`): a new version can jump far beyond its
    /// package.
    fresh_overshoots: Overshoots,
    /// Pipelines made by a retry (GitLab's pipeline strategy), hashed as
    /// [`JobAttempt::pipeline`]: the new one → the one it retried.
    retried_pipelines: HashMap<u64, u64>,
    /// The OOM-target calibration (`target_oom` > 0).
    calibration: Option<Calibration>,
    /// First attempts checked against their predicted P(OOM), by
    /// [`HISTORY_CLASSES`].
    checks: [CalibrationCheck; HISTORY_CLASSES.len()],
    /// Per [`HISTORY_CLASSES`]: how often checked first attempts ran
    /// beyond each point of the predictive tail (`tail_calibration`).
    tails: [ClassTails<SPREADS, 3>; HISTORY_CLASSES.len()],
    /// First attempts seen (one in two is checked).
    first_attempts: u64,
    /// The spread pooled over all workloads: a running mean of squared
    /// one-step-ahead residuals (the prior σ² where no parent level has
    /// one), and how many it holds.
    pooled_var: f64,
    pooled_n: f64,
    /// The site's prior for workloads never seen, per ladder (the last for
    /// workloads no ladder fits): a new GitHub job is not sized from Spack
    /// packages.
    newcomers: Vec<Newcomers>,
    /// How far new workloads' first builds landed from where they were
    /// placed, per ladder (as `newcomers`), fallback level, and whether a
    /// few more specific samples pulled the location ([`landing`]).
    landings: Vec<Landings>,
    /// Samples held at the most specific level (each observation once).
    held: usize,
    /// Windows no workload uses any more, to be handed out again.
    free: Vec<u32>,
    /// Workloads forgotten to stay within `max_workloads`.
    evicted: u64,
}

/// The most recent samples of one level key, oldest first, and their fit —
/// computed when first asked for and kept until a sample arrives: a fit
/// does not depend on when it is asked (recency weights are relative to the
/// newest sample), so answering costs no fitting between observations.
#[derive(Debug, Default)]
struct Window {
    samples: Vec<Sample>,
    fit: OnceLock<Fit>,
}

impl Window {
    fn fit(&self, knobs: &FitKnobs) -> Fit {
        *self.fit.get_or_init(|| stats::fit(&self.samples, knobs))
    }

    fn len(&self) -> usize {
        self.samples.len()
    }
}

/// No window (an empty level key, or one lost to a hash collision).
const NO_WINDOW: u32 = u32::MAX;

/// Ladder levels looked at (a longer configured ladder is cut here).
const MAX_LEVELS: usize = 16;

/// Residuals before the pooled spread replaces `prior_sigma`.
const POOLED_MIN: f64 = 50.0;

/// A new workload priced by its landings is never given less than this
/// share of its level's own predictive spread.
const LANDED_FLOOR: f64 = 0.5;

/// The pooled spread averages about this many recent residuals.
const POOLED_MEMORY: f64 = 5000.0;

/// Workloads that arrived with nothing known before the site's prior for
/// newcomers replaces the configured defaults.
const NEWCOMERS_MIN: f64 = 20.0;

/// The site's prior for newcomers follows about this many recent ones.
const NEWCOMERS_MEMORY: f64 = 500.0;

/// How big a workload the model has never seen turns out to be: a running
/// mean and variance of the first need of every workload whose whole ladder
/// was empty when it trained (a new package), recent ones weighing more.
/// Once `NEWCOMERS_MIN` are in, the next newcomer is priced from it like any
/// other estimate instead of getting the configured defaults — a site whose
/// builds are mostly 200 MB or mostly 20 GB is not sized at a fixed 5 GB.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Newcomers {
    n: f64,
    mean: f64,
    var: f64,
}

impl Newcomers {
    fn add(&mut self, ln_need: f64) {
        if !ln_need.is_finite() {
            return;
        }
        self.n += 1.0;
        let rate = (1.0 / self.n).max(1.0 / NEWCOMERS_MEMORY);
        let d = ln_need - self.mean;
        self.mean += rate * d;
        self.var = (1.0 - rate) * (self.var + rate * d * d);
    }

    /// The predictive distribution of the next newcomer's `ln(need)`.
    fn estimate(&self) -> Option<Estimate> {
        let n = self.n.min(NEWCOMERS_MEMORY);
        (self.n >= NEWCOMERS_MIN).then(|| Estimate {
            mu: self.mean,
            sd_pred: (self.var * (1.0 + 1.0 / n)).max(0.0).sqrt(),
            dof: n - 1.0,
            cores: None,
            shrunk: false,
            newcomer: true,
            fallback: 0,
            landed: false,
        })
    }
}

/// What the model keeps per full workload key.
#[derive(Debug, Clone, PartialEq)]
struct WorkloadState {
    /// Second hash of the full key.
    check: u64,
    /// Its OOM streak.
    streak: Streak,
    /// The window of each level of its ladder (`NO_WINDOW` for none),
    /// resolved at its first protected observation; empty before.
    windows: Vec<u32>,
    /// When it was last observed (as [`compact_time`]).
    last_seen: u32,
}

/// The level a recommendation is based on.
#[derive(Debug, Clone, Copy)]
struct Base<'a> {
    /// Index in the ladder.
    level: usize,
    /// Its attribute names (empty for a workload no ladder fits).
    attributes: &'a [String],
    /// Its window's index.
    id: u32,
    /// Its samples.
    window: &'a Window,
}

/// What a walk down a workload's ladder found.
#[derive(Debug, Clone, Copy)]
struct Found<'a> {
    /// The most specific level with samples, when it has fewer than
    /// `min_samples` (a new version's first jobs), and its index.
    own: Option<(usize, &'a Window)>,
    /// Samples of the exact workload (level 0).
    exact: usize,
    /// The most specific level with at least `min_samples`.
    base: Option<Base<'a>>,
    /// The next level after `base` with enough samples (another window).
    parent: Option<&'a Window>,
    /// The workload's ladder (`None`: none fits), whose prior for new
    /// workloads applies when no level holds a sample.
    ladder: Option<usize>,
}

/// The predictive distribution of the next `ln(peak)`.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Estimate {
    /// Location.
    mu: f64,
    /// Predictive standard deviation.
    sd_pred: f64,
    /// Student-t degrees of freedom.
    dof: f64,
    /// Average cores used.
    cores: Option<f64>,
    /// Whether the location blends a few more specific samples.
    shrunk: bool,
    /// Whether it is the site's prior for a workload never seen.
    newcomer: bool,
    /// The ladder level it stands on (0: the workload's own samples).
    fallback: usize,
    /// Whether it is priced by how far new workloads like it landed
    /// ([`landing`]), which is their record already: no class tail.
    landed: bool,
}

impl Estimate {
    /// `bytes` on the scale of the predictive t distribution.
    fn standardized(&self, bytes: f64) -> f64 {
        (bytes.max(1.0).ln() - self.mu) / self.sd_pred.max(1e-9)
    }
}

/// Whether window `id` of `windows` holds no sample (or is no window).
fn holds_nothing(windows: &[Window], id: u32) -> bool {
    windows.get(id as usize).is_none_or(|w| w.len() == 0)
}

/// Unix seconds as stored in a sample.
fn compact_time(at: f64) -> u32 {
    if at.is_finite() {
        at.clamp(0.0, f64::from(u32::MAX)) as u32
    } else {
        0
    }
}

/// `lognormal-q0.987`: the quantile to three decimals, formatted as an
/// integer (float formatting is a measurable part of answering).
fn quantile_statistic(q: f64) -> String {
    let thousandths = (q.clamp(0.0, 1.0) * 1000.0).round() as u32;
    format!(
        "lognormal-q{}.{:03}",
        thousandths / 1000,
        thousandths % 1000
    )
}

fn round_up(value: f64, unit: u64) -> u64 {
    if !(value.is_finite() && value > 0.0) {
        return if value.is_nan() || value <= 0.0 {
            0
        } else {
            u64::MAX / unit * unit
        };
    }
    let units = (value / unit as f64).ceil();
    if units >= (u64::MAX / unit) as f64 {
        u64::MAX / unit * unit
    } else {
        units as u64 * unit
    }
}

impl Model {
    /// A model with no history.
    pub fn new(params: Params) -> Self {
        let mut params = params;
        // Keep nonsense out of the maths rather than failing a request.
        params.window = params.window.clamp(1, stats::MAX_WINDOW);
        params.min_samples = params.min_samples.clamp(1, params.window);
        params.max_cpu_millicores = params.max_cpu_millicores.max(CPU_STEP_MILLICORES);
        params.ceiling_memory_bytes = (params.ceiling_memory_bytes / MB * MB).max(MB);
        params.min_memory_bytes = params
            .min_memory_bytes
            .clamp(MB, params.ceiling_memory_bytes);
        let probability = |q: f64, fallback: f64| {
            if q.is_finite() && q > 0.5 && q < 1.0 {
                q
            } else {
                fallback
            }
        };
        params.limit_quantile = probability(params.limit_quantile, 0.98);
        params.min_quantile = probability(params.min_quantile, 0.9);
        params.max_quantile = probability(params.max_quantile, 0.999).max(params.min_quantile);
        params.retry_quantile = probability(params.retry_quantile, 0.999);
        // 0 turns the learned overshoots off.
        params.retry_coverage = if params.retry_coverage == 0.0 {
            0.0
        } else {
            probability(params.retry_coverage, 0.95)
        };
        let non_negative = |x: f64| if x.is_finite() && x > 0.0 { x } else { 0.0 };
        params.limit_margin = non_negative(params.limit_margin);
        params.oom_cost = non_negative(params.oom_cost);
        params.target_oom = if params.target_oom.is_finite()
            && params.target_oom > 0.0
            && params.target_oom < 0.5
        {
            params.target_oom
        } else {
            0.0
        };
        params.prior_sigma = non_negative(params.prior_sigma);
        params.prior_weight = non_negative(params.prior_weight);
        params.parent_prior_weight = non_negative(params.parent_prior_weight);
        params.fallback_sigma = non_negative(params.fallback_sigma);
        params.clip = non_negative(params.clip);
        params.half_life_samples = non_negative(params.half_life_samples);
        params.half_life_days = non_negative(params.half_life_days);
        params.sigma_half_life_samples = non_negative(params.sigma_half_life_samples);
        params.censored_factor = non_negative(params.censored_factor).max(1.0);
        params.max_workloads = params.max_workloads.max(1);
        params.build_jobs_per_core = if params.build_jobs_per_core.is_finite() {
            params.build_jobs_per_core.clamp(0.1, 16.0)
        } else {
            1.0
        };
        let knobs = FitKnobs {
            half_life_samples: params.half_life_samples,
            sigma_half_life_samples: params.sigma_half_life_samples,
            half_life_days: params.half_life_days,
            clip: params.clip,
            clip_min_samples: params.clip_min_samples,
            // The calmest builds vary by about 3 %.
            clip_floor: 0.03,
        };
        let escaped = params
            .ladders
            .iter()
            .map(|ladder| {
                ladder
                    .iter()
                    .map(|level| level.iter().map(|a| escape_name(a)).collect())
                    .collect()
            })
            .collect();
        Self {
            knobs,
            escaped,
            hasher: KeyHasher::new(),
            levels: HashMap::new(),
            windows: Vec::new(),
            workloads: HashMap::new(),
            overshoots: Overshoots::new(),
            fresh_overshoots: Overshoots::new(),
            retried_pipelines: HashMap::new(),
            calibration: (params.target_oom > 0.0).then(|| {
                Calibration::new(
                    params.target_oom,
                    params.min_quantile,
                    params.max_quantile,
                    if params.oom_cost > 0.0 {
                        params.oom_cost
                    } else {
                        2.0
                    },
                )
            }),
            checks: [CalibrationCheck::default(); HISTORY_CLASSES.len()],
            tails: Default::default(),
            first_attempts: 0,
            pooled_var: params.prior_sigma.powi(2),
            pooled_n: 0.0,
            newcomers: vec![Newcomers::default(); params.ladders.len() + 1],
            landings: vec![Landings::default(); (params.ladders.len() + 1) * MAX_LEVELS * 2],
            params,
            held: 0,
            free: Vec::new(),
            evicted: 0,
        }
    }

    /// The cost of an OOM kill the next limits are priced with: the
    /// calibrated multiplier, or the configured `oom_cost`.
    pub fn oom_cost(&self) -> f64 {
        self.calibration
            .as_ref()
            .map_or(self.params.oom_cost, Calibration::lambda)
    }

    /// Where the prior for new workloads of `ladder` is kept (`None`: no
    /// ladder fits, the last slot).
    fn newcomer_slot(&self, ladder: Option<usize>) -> usize {
        ladder.unwrap_or(self.params.ladders.len())
    }

    /// The prior for new workloads of `ladder`.
    fn newcomers(&self, ladder: Option<usize>) -> Newcomers {
        self.newcomers
            .get(self.newcomer_slot(ladder))
            .copied()
            .unwrap_or_default()
    }

    /// The prior σ² of a workload's spread where no parent level has one:
    /// the pooled residual spread once enough residuals are in.
    fn prior_var(&self) -> f64 {
        if self.pooled_n >= POOLED_MIN {
            self.pooled_var
        } else {
            self.params.prior_sigma.powi(2)
        }
    }

    /// The effective parameters (nonsense values replaced).
    pub fn params(&self) -> &Params {
        &self.params
    }

    /// Whether a history is being replayed (at start-up): the learned
    /// tails refit less often until it ends, and all of them then. Nothing
    /// is asked of the model meanwhile, so the risks it states afterwards
    /// stand on the whole record all the same.
    pub fn set_replaying(&mut self, replaying: bool) {
        for class in &mut self.tails {
            class.set_replaying(replaying);
        }
        for record in &mut self.landings {
            record.set_replaying(replaying);
        }
    }

    /// Number of distinct workloads (full keys) seen and of samples held at
    /// the most specific level of their ladder (each observation counts once,
    /// up to `window` per key).
    pub fn stats(&self) -> (usize, usize) {
        (self.workloads.len(), self.held)
    }

    /// The tail estimate `e` of history class `class` is priced with: its
    /// group's, as its class restates it (`None` with `tail_calibration`
    /// off).
    fn tail_of(&self, class: usize, e: &Estimate) -> Option<Shape> {
        (self.params.tail_calibration && !e.landed).then(|| self.tails[class].of(tail_group(e)))
    }

    /// P(next peak > `bytes`) for estimate `e` of history class `class`:
    /// the tail its group realized, or the estimate's own with
    /// `tail_calibration` off.
    fn oom_probability(&self, class: usize, e: &Estimate, bytes: f64) -> f64 {
        let z = e.standardized(bytes);
        match self.tail_of(class, e) {
            Some(tail) => tail.survival(z, e.dof, e.sd_pred),
            None => stats::t_survival(z, e.dof),
        }
    }

    /// The predictive spread of estimate `e` of class `class` as its
    /// group's tail realized it, or (no class tail: a workload priced by
    /// its landings, or `tail_calibration` off) as wide as the normal
    /// with the estimate's own t's 3 % point: what a limit's slack is
    /// priced with. A heavy t covers its far tail at a high price, so its
    /// limits take more risk, as a wider normal's would.
    fn effective_spread(&self, class: usize, e: &Estimate) -> f64 {
        e.sd_pred
            * self
                .tail_of(class, e)
                .map_or_else(|| tail::t_normal_scale(e.dof), |t| t.normal_scale())
    }

    /// The `q` quantile of the next `ln(peak)` for estimate `e` of class
    /// `class` (as [`Model::oom_probability`] prices it).
    fn ln_quantile(&self, class: usize, e: &Estimate, q: f64) -> f64 {
        let z = match self.tail_of(class, e) {
            Some(tail) => tail.z_for(1.0 - q, e.dof, e.sd_pred),
            None => stats::t_quantile(q, e.dof),
        };
        e.mu + z * e.sd_pred
    }

    /// First attempts checked against their predicted P(OOM), by
    /// [`HISTORY_CLASSES`].
    pub fn calibration_checks(&self) -> [CalibrationCheck; HISTORY_CLASSES.len()] {
        self.checks
    }

    /// Workloads forgotten so far to stay within `max_workloads`.
    pub fn evicted(&self) -> u64 {
        self.evicted
    }

    /// Records that pipeline `new` (of `forge` at `instance`) was made by a
    /// retry of pipeline `old`: a job's attempt in `new` follows its
    /// workload's killed attempt in `old`.
    pub fn link_pipelines(&mut self, forge: &str, instance: &str, old: u64, new: u64) {
        let (old, new) = (
            pipeline_key(forge, instance, old),
            pipeline_key(forge, instance, new),
        );
        if old == 0 || new == 0 {
            return;
        }
        if self.retried_pipelines.len() >= RETRIED_PIPELINES_KEPT {
            self.retried_pipelines.clear();
        }
        self.retried_pipelines.insert(new, old);
    }

    /// Says which pipeline an attempt observed without one ran in (its
    /// report came before its job's webhook): `attempt` with its pipeline,
    /// of the workload with key `full`.
    pub fn place(&mut self, full: &str, attempt: JobAttempt) {
        let (index, check) = self.hasher.hash(full);
        let via = self.retried_pipelines.get(&attempt.pipeline).copied();
        if let Some(state) = self.workloads.get_mut(&index)
            && state.check == check
        {
            state.streak.place(attempt, via);
        }
    }

    /// Adds one finished job attempt of `workload`. Observations may arrive
    /// slightly out of time order.
    pub fn observe(&mut self, workload: &Workload, obs: Observation) {
        self.observe_key(&full_key(workload), obs);
    }

    /// [`Model::observe`] for a workload given by its key (as
    /// `runyard_store::workload::key` makes it, e.g. a projection row's
    /// `workload_key`): the attributes are only parsed back out of it the
    /// first time the workload trains the model.
    pub fn observe_key(&mut self, full: &str, obs: Observation) {
        let at = if obs.at.is_finite() { obs.at } else { 0.0 };
        let keep = self.params.oom_max_retries as usize + 1;
        let (index, check) = self.hasher.hash(full);
        if self.workloads.len() >= self.params.max_workloads && !self.workloads.contains_key(&index)
        {
            self.evict();
        }
        let state = self
            .workloads
            .entry(index)
            .or_insert_with(|| WorkloadState {
                check,
                streak: Streak::new(),
                windows: Vec::new(),
                last_seen: 0,
            });
        if state.check != check {
            // Another workload holds this 64-bit hash: keep the first.
            return;
        }
        state.last_seen = state.last_seen.max(compact_time(at));
        // A first attempt: no kill of this workload since its last success
        // (a retry follows a kill).
        let first_attempt = state.streak.kills.is_empty();
        let fresh = state
            .windows
            .first()
            .is_none_or(|&id| holds_nothing(&self.windows, id));
        let via = obs
            .job
            .and_then(|j| self.retried_pipelines.get(&j.pipeline).copied());
        if let Some((ratio, fresh)) = state.streak.record(at, &obs, via, keep, fresh) {
            self.overshoots.add(ratio);
            if fresh {
                self.fresh_overshoots.add(ratio);
            }
        }
        if obs.protected && state.windows.is_empty() {
            let ids = self.intern_levels(&runyard_store::workload::parse_key(full), full);
            if let Some(state) = self.workloads.get_mut(&index) {
                state.windows = ids;
            }
        }
        let Some(state) = self.workloads.get(&index) else {
            return;
        };
        // What the model believed before this attempt: the estimate its
        // limit was priced with.
        let wants_spread = first_attempt
            && self
                .calibration
                .as_ref()
                .is_some_and(Calibration::wants_spread);
        // One first attempt in two is checked against its prediction.
        let wants_check = first_attempt
            && obs.memory_limit_bytes.is_some()
            && self.first_attempts.is_multiple_of(2);
        if first_attempt {
            self.first_attempts += 1;
        }
        // Nothing on its ladder yet: a new workload, priced (and, when
        // protected, teaching) the prior for new workloads of its ladder.
        let newcomer = state
            .windows
            .iter()
            .all(|&id| holds_nothing(&self.windows, id));
        // A protected first build of a workload with no sample of its own,
        // priced from another level of its ladder: how far it lands teaches
        // how new workloads like it are priced.
        let lands = obs.protected && first_attempt && fresh && !newcomer;
        let needs_estimate =
            wants_spread || wants_check || lands || (obs.protected && obs.oom_killed);
        // (A workload with no sample of its own is priced by the record of
        // its ladder's new workloads: its ladder is needed then too.)
        let ladder = if (newcomer && obs.protected) || (fresh && needs_estimate) {
            select_ladder(
                &self.params.ladders,
                &runyard_store::workload::parse_key(full),
            )
        } else {
            None
        };
        let (estimate, class) = if needs_estimate {
            // A workload that never trained (a pull request's) has no
            // windows of its own: found by its key, as it was priced.
            let found = if state.windows.is_empty() {
                self.find(&runyard_store::workload::parse_key(full), full, None)
            } else {
                self.found_from_ids(&state.windows, None, ladder)
            };
            let estimate = self.estimate(&found);
            (
                estimate,
                estimate.map(|e| class_of(e.newcomer, found.exact)),
            )
        } else {
            (None, None)
        };
        // Where it landed from the location it was priced at (unless it
        // trains nothing, as below).
        let landed = estimate
            .filter(|e| lands && e.fallback > 0 && class == Some(class_of(false, 0)))
            .map(|e| (self.landing_slot(ladder, &e), e.mu));
        // A sample older than a full window is dropped there: it trains
        // nothing, the pooled spread and the tails included.
        let dropped = state
            .windows
            .first()
            .and_then(|&id| self.windows.get(id as usize))
            .is_some_and(|w| {
                w.len() >= self.params.window
                    && w.samples.first().is_some_and(|s| compact_time(at) < s.at)
            });
        if let (true, Some(e), Some(class), Some(limit)) =
            (wants_check, estimate, class, obs.memory_limit_bytes)
        {
            let predicted = self.oom_probability(class, &e, limit as f64);
            let check = &mut self.checks[class];
            check.attempts += 1;
            check.kills += u64::from(obs.oom_killed);
            check.predicted += predicted;
            let z_peak = (!obs.oom_killed).then(|| e.standardized(obs.peak_memory_bytes as f64));
            if !dropped {
                self.tails[class].record(
                    tail_group(&e),
                    z_peak,
                    e.standardized(limit as f64),
                    e.dof,
                    e.sd_pred,
                );
            }
        }
        if first_attempt && self.calibration.is_some() {
            let (sd, far) = estimate.zip(class).filter(|_| wants_spread).map_or(
                (f64::NAN, f64::NAN),
                |(e, class)| {
                    (
                        self.effective_spread(class, &e),
                        self.tail_of(class, &e).map_or(0.0, |t| t.far()),
                    )
                },
            );
            if let Some(calibration) = &mut self.calibration {
                calibration.record(sd, far, obs.oom_killed);
            }
        }
        if !obs.protected {
            // Nothing learned (no sample, no kill to remember): keep no
            // state for it, so unprotected reports cannot grow the model.
            if self
                .workloads
                .get(&index)
                .is_some_and(|s| s.windows.is_empty() && s.streak.is_empty())
            {
                self.workloads.remove(&index);
            }
            return;
        }

        let mut ln_need = (obs.peak_memory_bytes as f64).max(MB as f64).ln();
        if obs.oom_killed {
            // Censored: the job needed more than the limit it was killed at.
            // It trains as its expected need given that (the predictive
            // distribution's mean above the limit), never below the limit
            // or the location: a kill never pulls the model down.
            let limit = obs.memory_limit_bytes.unwrap_or(0) as f64;
            let floor = (obs.peak_memory_bytes as f64)
                .max(limit)
                .max(MB as f64)
                .ln();
            ln_need = match estimate {
                Some(e) => {
                    let a = (floor - e.mu) / e.sd_pred.max(1e-9);
                    (e.mu + e.sd_pred.max(1e-9) * stats::inverse_mills(a))
                        .max(floor + 0.01)
                        .max(e.mu)
                }
                None => floor + self.params.censored_factor.ln(),
            };
        }
        let cores = if obs.wall_seconds.is_finite()
            && obs.wall_seconds > 0.0
            && obs.cpu_seconds.is_finite()
            && obs.cpu_seconds >= 0.0
        {
            (obs.cpu_seconds / obs.wall_seconds).min(4096.0) as f32
        } else {
            f32::NAN
        };
        // The one-step-ahead residual against the most specific level: the
        // σ of every level is built from these, so a level mixing versions or
        // variants still measures the spread within a workload.
        let resid = state
            .windows
            .iter()
            .find(|&&id| id != NO_WINDOW)
            .map(|&id| &self.windows[id as usize])
            .filter(|window| window.len() > 0)
            .map_or(f32::NAN, |window| {
                let fit = window.fit(&self.knobs);
                ((ln_need - fit.mu) / (1.0 + 1.0 / fit.n_eff).sqrt()) as f32
            });
        if resid.is_finite() && !obs.oom_killed && !dropped {
            // Pool the spread of all workloads; a spike counts as at most
            // 3.5 pooled σ.
            let r2 = f64::from(resid).powi(2).min(12.25 * self.prior_var());
            self.pooled_n += 1.0;
            let rate = (1.0 / self.pooled_n).max(1.0 / POOLED_MEMORY);
            self.pooled_var += rate * (r2 - self.pooled_var);
        }
        let sample = Sample {
            at: compact_time(at),
            ln_peak: ln_need as f32,
            resid,
            cores,
        };
        let Some(state) = self.workloads.get(&index) else {
            return;
        };
        if newcomer {
            let slot = self.newcomer_slot(ladder);
            if let Some(prior) = self.newcomers.get_mut(slot) {
                prior.add(ln_need);
            }
        }
        if let Some((slot, mu)) = landed.filter(|_| !dropped) {
            // A killed build is known only to need more than its limit.
            let limit = obs
                .memory_limit_bytes
                .map(|limit| (limit as f64).max(1.0).ln() - mu);
            let distance = match limit.filter(|_| obs.oom_killed) {
                Some(limit) => limit,
                None => ln_need - mu,
            };
            if let Some(record) = self.landings.get_mut(slot) {
                record.add(distance, limit, obs.oom_killed);
            }
        }
        let cap = self.params.window;
        for (level, &id) in state.windows.iter().enumerate() {
            // Levels that collapse to one key (an absent attribute) hold the
            // sample once.
            if id == NO_WINDOW || state.windows[..level].contains(&id) {
                continue;
            }
            let window = &mut self.windows[id as usize];
            let grew = stats::insert_sample(&mut window.samples, sample, cap);
            window.fit = OnceLock::new();
            if level == 0 && grew {
                self.held += 1;
            }
        }
    }

    /// The recommendation for the next job of `workload`. A pure read.
    pub fn recommend(&self, workload: &Workload) -> Recommendation {
        self.recommend_keyed(workload, &full_key(workload), None)
    }

    /// [`Model::recommend`] for a job that retries attempt `retry_of`: when
    /// that attempt was OOM-killed (and its job has reported no later
    /// attempt), the limit is bumped above the one it was killed at,
    /// whatever other builds of the workload did since.
    pub fn recommend_retry(&self, workload: &Workload, retry_of: JobAttempt) -> Recommendation {
        self.recommend_keyed(workload, &full_key(workload), Some(retry_of))
    }

    /// [`Model::recommend`] for a caller that already made the workload's
    /// key ([`full_key`]), retrying `retry_of` when it says so.
    pub(crate) fn recommend_keyed(
        &self,
        workload: &Workload,
        full: &str,
        retry_of: Option<JobAttempt>,
    ) -> Recommendation {
        let p = &self.params;

        let (index, check) = self.hasher.hash(full);
        let state = self.workloads.get(&index).filter(|s| s.check == check);
        let found = self.find(workload, full, state);

        let ceiling = p.ceiling_memory_bytes;
        let clamp_limit = |bytes: u64| bytes.clamp(p.min_memory_bytes, ceiling);
        let mut basis = Basis {
            samples: 0,
            matched: Vec::new(),
            level: -1,
            statistic: String::new(),
            oom_bump: false,
            retries_exhausted: false,
            defaults: true,
            workload_samples: u32::try_from(found.exact).unwrap_or(u32::MAX),
            oom_probability: None,
            spread: None,
            site_prior: false,
        };
        let estimate = self.estimate(&found);
        let class = estimate.map(|e| class_of(e.newcomer, found.exact));
        let cost = self.oom_cost();
        let (mut limit, request, retry_floor, cores) = match (estimate, class) {
            (Some(est), Some(class)) => {
                // The predictive point the site's record says is exceeded
                // with probability 1 − q.
                let quantile = |q: f64| self.ln_quantile(class, &est, q);
                let q = if cost > 0.0 {
                    let z = stats::newsvendor_z(self.effective_spread(class, &est), cost);
                    stats::normal_probability(z).clamp(p.min_quantile, p.max_quantile)
                } else {
                    p.limit_quantile
                };
                let limit = quantile(q).exp() * (1.0 + p.limit_margin);
                if let (None, Some((level, own))) = (found.base, found.own) {
                    basis.samples = u32::try_from(own.len()).unwrap_or(u32::MAX);
                    basis.level = i32::try_from(level).unwrap_or(i32::MAX);
                    basis.matched = select_ladder(&p.ladders, workload).map_or_else(
                        || workload.keys().cloned().collect(),
                        |l| p.ladders[l][level].clone(),
                    );
                }
                if let Some(base) = found.base {
                    basis.samples = u32::try_from(base.window.len()).unwrap_or(u32::MAX);
                    basis.matched = if base.attributes.is_empty() {
                        workload.keys().cloned().collect()
                    } else {
                        base.attributes.to_vec()
                    };
                    basis.level = i32::try_from(base.level).unwrap_or(i32::MAX);
                }
                basis.defaults = false;
                basis.spread = Some(est.sd_pred);
                basis.site_prior = est.newcomer;
                basis.statistic = quantile_statistic(q);
                if p.limit_margin > 0.0 {
                    basis.statistic += &format!("+{}%", (p.limit_margin * 100.0).round());
                }
                if est.shrunk {
                    basis.statistic.push_str("+shrunk");
                }
                if est.newcomer {
                    basis.statistic.push_str("+newcomer");
                }
                (
                    clamp_limit(round_up(limit, MB)),
                    round_up(est.mu.exp(), MB),
                    // A newcomer's spread is the whole site's: its retry
                    // floor would be far beyond any bump.
                    if est.newcomer {
                        0
                    } else {
                        round_up(quantile(p.retry_quantile).exp(), MB)
                    },
                    est.cores,
                )
            }
            _ => {
                basis.statistic = "defaults".to_owned();
                (
                    clamp_limit(round_up(p.default_memory_limit_bytes as f64, MB)),
                    round_up(p.default_memory_bytes as f64, MB),
                    0,
                    None,
                )
            }
        };

        // The retried attempt's own kill when the request names one that
        // is open. A request that names none is no retry: the workload's
        // streak bumps it only when its kills named no job (reports of
        // callers that cannot say which attempt they retry).
        let streak = state.map(|s| &s.streak);
        let open = retry_of.and_then(|r| streak?.open_kill(r));
        let legacy =
            streak.filter(|s| retry_of.is_none() && s.kills.last().is_some_and(|k| !k.identified));
        let chain = match (open, legacy) {
            (Some(o), _) => Some((o.chain, o.kill, o.first)),
            (None, Some(s)) => s.kills.last().zip(s.kills.first()).map(|(latest, first)| {
                (
                    u32::try_from(s.kills.len()).unwrap_or(u32::MAX),
                    *latest,
                    *first,
                )
            }),
            (None, None) => None,
        };
        // A job's retries are spent by its own chain, or when its workload
        // has been killed more than `oom_max_retries` times in a row (no
        // build passed since): the scaler then retries none of them.
        let workload_kills = streak.map_or(0, |s| s.kills.len());
        let spent = open.is_some() && workload_kills > p.oom_max_retries as usize;
        let mut retry_count = 0;
        if let Some((kills, latest, first)) = chain {
            if kills > p.oom_max_retries || spent {
                retry_count = p.oom_max_retries;
                basis.retries_exhausted = true;
                basis.statistic.push_str("+oom-exhausted");
            } else {
                let bumped = self.bumped(&latest, &first).max(retry_floor);
                limit = limit.max(bumped).min(ceiling);
                retry_count = kills;
                basis.oom_bump = true;
                basis.statistic.push_str("+oom-bump");
            }
        }

        let memory_request = request.clamp(MB, limit);
        basis.oom_probability = estimate
            .zip(class)
            .map(|(e, class)| self.oom_probability(class, &e, limit as f64));

        let max_cpu = p.max_cpu_millicores;
        let cpu_request = match cores {
            Some(c) => round_up(c * 1000.0, CPU_STEP_MILLICORES),
            None => round_up(p.default_cpu_millicores as f64, CPU_STEP_MILLICORES),
        }
        .clamp(CPU_STEP_MILLICORES, max_cpu);
        let max_jobs = (max_cpu / 1000).max(1);
        let jobs = (cpu_request as f64 / 1000.0 * p.build_jobs_per_core).ceil();
        let build_jobs = (jobs as u64).clamp(1, max_jobs);
        let cpu_limit = (build_jobs * 1000).clamp(cpu_request, max_cpu);

        Recommendation {
            cpu_request_millicores: cpu_request.min(cpu_limit),
            cpu_limit_millicores: cpu_limit,
            memory_request_bytes: memory_request,
            memory_limit_bytes: limit,
            build_jobs: u32::try_from(build_jobs).unwrap_or(u32::MAX),
            retry_count,
            basis,
        }
    }

    /// The limit after a kill: the rule's bump of the `latest` killed
    /// limit (×1.2, at least +`OOM_ADD_BYTES`, at least 1.2 × the usage at
    /// the kill) and, learned, enough to cover `retry_coverage` of the
    /// overshoots seen beyond what the chain since `first` has ruled out.
    fn bumped(&self, latest: &Killed, first: &Killed) -> u64 {
        let p = &self.params;
        let peak = latest.peak as f64;
        let previous = latest.limit.map_or(peak, |l| l as f64);
        let bumped = (previous * OOM_FACTOR)
            .max(previous + OOM_ADD_BYTES as f64)
            .max(peak * OOM_FACTOR);
        let learned = Some((first.limit, first.fresh))
            .filter(|_| p.retry_coverage > 0.0)
            .and_then(|(limit, fresh)| Some((limit?, fresh)))
            .filter(|&(first, _)| first > 0)
            .and_then(|(first, fresh)| {
                let ruled_out = previous / first as f64;
                let all = self.overshoots.quantile_above(ruled_out, p.retry_coverage);
                // A new workload's kill covers new workloads' overshoots
                // too, once there are enough of them.
                let new = fresh
                    .then(|| {
                        self.fresh_overshoots
                            .quantile_above(ruled_out, p.retry_coverage)
                    })
                    .flatten();
                all.into_iter()
                    .chain(new)
                    .reduce(f64::max)
                    .map(|ratio| first as f64 * ratio)
            })
            .unwrap_or(0.0);
        round_up(bumped.max(learned), MB)
    }

    /// The window of every level of `workload`'s ladder, created as needed.
    fn intern_levels(&mut self, workload: &Workload, full: &str) -> Vec<u32> {
        let ladder = select_ladder(&self.params.ladders, workload);
        let n = ladder.map_or(1, |l| self.escaped[l].len());
        let mut key = String::with_capacity(full.len());
        let mut ids = Vec::with_capacity(n);
        for level in 0..n {
            match ladder {
                Some(l) => sub_key(full, &self.escaped[l][level], &mut key),
                None => {
                    key.clear();
                    key.push_str(full);
                }
            }
            ids.push(if key.is_empty() {
                NO_WINDOW
            } else {
                self.intern(&key)
            });
        }
        ids
    }

    /// The window of a level key, created when new.
    fn intern(&mut self, key: &str) -> u32 {
        let (index, check) = self.hasher.hash(key);
        match self.levels.get(&index) {
            Some(&(c, id)) if c == check => id,
            // Another key holds this 64-bit hash: this one gets no history.
            Some(_) => NO_WINDOW,
            None => {
                let id = match self.free.pop() {
                    Some(id) => id,
                    None => {
                        let id = u32::try_from(self.windows.len()).unwrap_or(NO_WINDOW);
                        if id != NO_WINDOW {
                            self.windows.push(Window::default());
                        }
                        id
                    }
                };
                if id != NO_WINDOW {
                    self.levels.insert(index, (check, id));
                }
                id
            }
        }
    }

    /// Forgets the least recently observed eighth of the workloads, and
    /// the windows no remaining workload uses (their slots are reused).
    /// Amortised: one pass over the state per `max_workloads / 8` new
    /// workloads.
    fn evict(&mut self) {
        let cap = self.params.max_workloads;
        let keep = cap - cap / 8;
        let excess = self.workloads.len().saturating_sub(keep);
        if excess == 0 {
            return;
        }
        let mut ages: Vec<u32> = self.workloads.values().map(|s| s.last_seen).collect();
        let (_, &mut cutoff, _) = ages.select_nth_unstable(excess - 1);
        // Everything older than the cutoff goes, then ties until `excess`.
        let mut ties = excess - ages[..excess].iter().filter(|&&a| a < cutoff).count();
        self.workloads.retain(|_, s| {
            if s.last_seen < cutoff {
                false
            } else if s.last_seen == cutoff && ties > 0 {
                ties -= 1;
                false
            } else {
                true
            }
        });
        self.evicted += excess as u64;
        let mut used = vec![false; self.windows.len()];
        let mut exact = vec![false; self.windows.len()];
        for s in self.workloads.values() {
            for (level, &id) in s.windows.iter().enumerate() {
                if id != NO_WINDOW {
                    used[id as usize] = true;
                    exact[id as usize] |= level == 0;
                }
            }
        }
        self.levels.retain(|_, &mut (_, id)| used[id as usize]);
        self.free.clear();
        self.held = 0;
        for (id, window) in self.windows.iter_mut().enumerate() {
            if !used[id] {
                *window = Window::default();
                self.free.push(id as u32);
            } else if exact[id] {
                self.held += window.len();
            }
        }
        // Lowest slots first, so the vector's tail is what stays unused.
        self.free.reverse();
    }

    /// The window of a level key, if it has one.
    fn lookup(&self, key: &str) -> u32 {
        let (index, check) = self.hasher.hash(key);
        match self.levels.get(&index) {
            Some(&(c, id)) if c == check => id,
            _ => NO_WINDOW,
        }
    }

    /// Walks the ladder of `workload` (whose full key is `full`; `state` is
    /// what the model keeps about it, if anything).
    fn find<'a>(
        &'a self,
        workload: &Workload,
        full: &str,
        state: Option<&WorkloadState>,
    ) -> Found<'a> {
        let p = &self.params;
        let ladder = select_ladder(&p.ladders, workload);
        let n = ladder.map_or(1, |l| self.escaped[l].len());
        let attributes = ladder.map(|l| p.ladders[l].as_slice());
        if let Some(state) = state.filter(|s| s.windows.len() == n) {
            return self.found_from_ids(&state.windows, attributes, ladder);
        }
        let mut key = String::new();
        let mut ids = [NO_WINDOW; MAX_LEVELS];
        for (level, id) in ids.iter_mut().enumerate().take(n) {
            match ladder {
                Some(l) => sub_key(full, &self.escaped[l][level], &mut key),
                None => {
                    key.clear();
                    key.push_str(full);
                }
            }
            if !key.is_empty() {
                *id = self.lookup(&key);
            }
        }
        self.found_from_ids(&ids[..n.min(MAX_LEVELS)], attributes, ladder)
    }

    /// What the windows `ids` of a workload's ladder levels (most specific
    /// first; `attributes` their names, if known; `ladder` which ladder)
    /// hold.
    fn found_from_ids<'a>(
        &'a self,
        ids: &[u32],
        attributes: Option<&'a [Vec<String>]>,
        ladder: Option<usize>,
    ) -> Found<'a> {
        let p = &self.params;
        let mut found = Found {
            own: None,
            exact: 0,
            base: None,
            parent: None,
            ladder,
        };
        for (level, &id) in ids.iter().enumerate() {
            let Some(window) = self.windows.get(id as usize).filter(|w| w.len() > 0) else {
                continue;
            };
            if level == 0 {
                found.exact = window.len();
            }
            match found.base {
                None if window.len() >= p.min_samples => {
                    found.base = Some(Base {
                        level,
                        attributes: attributes
                            .and_then(|a| a.get(level))
                            .map_or(&[][..], Vec::as_slice),
                        id,
                        window,
                    });
                }
                None => {
                    if found.own.is_none() {
                        found.own = Some((level, window));
                    }
                }
                Some(base) => {
                    if window.len() >= p.min_samples && id != base.id {
                        found.parent = Some(window);
                        break;
                    }
                }
            }
        }
        found
    }

    /// The predictive distribution of the next `ln(peak)`: location from the
    /// base level (shrunk towards the few samples of a more specific level,
    /// if any), σ² from the base level's residuals with the parent level's
    /// (or the configured) σ as prior.
    fn estimate(&self, found: &Found<'_>) -> Option<Estimate> {
        let p = &self.params;
        let global_var = self.prior_var();
        let Some(Base { level, window, .. }) = found.base else {
            // Only a few samples anywhere on the ladder: their mean, with
            // the pooled spread as σ (worth `prior_weight` samples) and, at a
            // coarser level than the workload's own, the fallback's
            // uncertainty on top.
            let Some((level, own)) = found.own else {
                return self.newcomers(found.ladder).estimate();
            };
            let fit = own.fit(&self.knobs);
            let var = global_var;
            let mut var_mu = var / fit.n_eff;
            if level > 0 {
                var_mu += p.fallback_sigma.powi(2).max(fit.value_var);
            }
            let e = Estimate {
                mu: fit.mu,
                sd_pred: (var + var_mu).max(0.0).sqrt(),
                dof: p.prior_weight.max(1.0),
                cores: fit.cores,
                shrunk: false,
                newcomer: false,
                fallback: level,
                landed: false,
            };
            return Some(self.landed(found, e, var * (1.0 + 1.0 / fit.n_eff)));
        };
        let base = window.fit(&self.knobs);
        let parent = found.parent.map(|w| w.fit(&self.knobs));
        let (prior_var, prior_weight) = match parent {
            Some(f) if f.resid_n > 0.0 => (
                (p.prior_weight * global_var + f.resid_n * f.resid_var)
                    / (p.prior_weight + f.resid_n).max(1e-9),
                p.parent_prior_weight,
            ),
            _ => (global_var, p.prior_weight),
        };
        let dof = prior_weight + base.resid_n;
        let var = if dof > 0.0 {
            (prior_weight * prior_var + base.resid_n * base.resid_var) / dof
        } else {
            global_var
        };
        let mut mu = base.mu;
        let mut var_mu = var / base.n_eff;
        let mut cores = base.cores;
        let mut shrunk = false;
        if level > 0 {
            // A fallback: this workload may sit anywhere near the level's
            // mix — as far as the level's own workloads spread beyond their
            // residuals, and at least `fallback_sigma`.
            var_mu += p.fallback_sigma.powi(2).max(base.value_var - var);
            if let Some((_, own)) = found.own {
                let own = own.fit(&self.knobs);
                let prior_precision = 1.0 / var_mu.max(1e-12);
                let data_precision = own.n_eff / var.max(1e-12);
                mu = (mu * prior_precision + own.mu * data_precision)
                    / (prior_precision + data_precision);
                var_mu = 1.0 / (prior_precision + data_precision);
                cores = own.cores.or(cores);
                shrunk = true;
            }
        }
        let e = Estimate {
            mu,
            sd_pred: (var + var_mu).max(0.0).sqrt(),
            dof: dof.max(1.0),
            cores,
            shrunk,
            newcomer: false,
            fallback: level,
            landed: false,
        };
        Some(self.landed(found, e, var * (1.0 + 1.0 / base.n_eff)))
    }

    /// Where first builds of new workloads priced as `e` (of `ladder`) are
    /// recorded.
    fn landing_slot(&self, ladder: Option<usize>, e: &Estimate) -> usize {
        (self.newcomer_slot(ladder) * MAX_LEVELS + e.fallback.min(MAX_LEVELS - 1)) * 2
            + usize::from(e.shrunk)
    }

    /// Estimate `e` of a workload with no sample of its own, priced by how
    /// far new workloads like it landed once enough have: their t about
    /// its location, never narrower than [`LANDED_FLOOR`] of its level's
    /// own predictive spread (`level_var`, the variance).
    fn landed(&self, found: &Found<'_>, mut e: Estimate, level_var: f64) -> Estimate {
        if found.exact > 0 || e.fallback == 0 {
            return e;
        }
        if let Some(fit) = self
            .landings
            .get(self.landing_slot(found.ladder, &e))
            .and_then(Landings::fitted)
        {
            e.sd_pred = fit.scale.max(LANDED_FLOOR * level_var.max(0.0).sqrt());
            e.dof = fit.dof;
            e.landed = true;
        }
        e
    }
}
