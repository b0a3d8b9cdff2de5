//! A month of a busy CI site, as the event log would hold it: Spack
//! pipelines on a GitLab instance and GitHub Actions runs, every job with
//! its webhooks (queued, in progress, completed), the runner the scaler
//! made for it (requested, created, online, assigned, deleted; a few create
//! attempts fail and are retried), its usage report; a few per cent
//! OOM-killed, their pipelines or runs retried with more memory (or the
//! retry refused), and the newest few hundred jobs still queued or held
//! back when the month ends.
//!
//! Everything is a pure function of the [`MonthSpec`]: a pipeline's events
//! are the same whenever they are made, so seeding can stop and go on
//! from any pipeline ([`Month::pipeline_events`]).
//!
//! Workloads are skewed the way a package repository's are: every one of
//! [`MonthSpec::workloads`] is built at least once, and the rest of the
//! builds follow a power law over their rank (rank 0 is built most often:
//! about 3 % of the Spack builds at the default size; half the workloads
//! are built at most twice).

use std::collections::BTreeMap;

use rand::rngs::StdRng;
use rand::seq::SliceRandom as _;
use rand::{Rng as _, SeedableRng as _};
use runyard_events::{
    Body, Conclusion, Event, Forge, JobKey, JobObserved, JobStatus, PipelineObserved, Recommended,
    RetryIssued, RetryJob, RetryRefused, RetryRequested, RetryTarget, RunnerAssigned,
    RunnerCreated, RunnerDeleted, RunnerFailed, RunnerOnline, RunnerRef, RunnerRequested, Source,
    UsageReported, ids, timestamp,
};
use time::{Duration, OffsetDateTime};

/// The GitLab instance the Spack pipelines run on.
pub const GITLAB: &str = "gitlab.spack.example";
/// The GitHub instance.
pub const GITHUB: &str = super::INSTANCE;

/// Jobs ids: base jobs of GitLab and GitHub, and the jobs of retries, in
/// ranges of their own (a job's index is added).
const GITLAB_JOB0: u64 = 10_000_000;
const GITLAB_RETRY_JOB0: u64 = 40_000_000;
const GITHUB_JOB0: u64 = 30_000_000_000;
const GITHUB_RETRY_JOB0: u64 = 31_000_000_000;
/// Pipeline (GitLab) and run (GitHub) ids (a plan's index is added).
const GITLAB_PIPELINE0: u64 = 1_000_000;
const GITLAB_RETRY_PIPELINE0: u64 = 3_000_000;
const GITHUB_RUN0: u64 = 9_000_000_000;

/// Stream sequences: pipeline `p`'s `i`-th event is `p * SEQ_STRIDE + i`.
pub const SEQ_STRIDE: u64 = 100_000;

/// GitLab projects and their share of the Spack pipelines (cumulative).
const GITLAB_PROJECTS: [(&str, u64, f64); 4] = [
    ("spack/spack", 2, 0.80),
    ("spack/spack-packages", 3, 0.92),
    ("e4s/e4s-ci", 4, 0.97),
    ("hpc/site-stack", 5, 1.0),
];

/// Real package names for the most-built workloads; the long tail gets
/// made-up ones.
const PACKAGES: [&str; 48] = [
    "cmake",
    "zlib-ng",
    "openmpi",
    "hdf5",
    "boost",
    "llvm",
    "python",
    "py-numpy",
    "gcc",
    "trilinos",
    "petsc",
    "mpich",
    "openblas",
    "netcdf-c",
    "kokkos",
    "hypre",
    "py-scipy",
    "curl",
    "openssl",
    "libxml2",
    "perl",
    "ncurses",
    "readline",
    "sqlite",
    "superlu-dist",
    "mfem",
    "sundials",
    "ginkgo",
    "raja",
    "umpire",
    "py-torch",
    "py-pandas",
    "adios2",
    "paraview",
    "vtk",
    "qt",
    "cuda",
    "hwloc",
    "libfabric",
    "ucx",
    "fftw",
    "gromacs",
    "lammps",
    "amrex",
    "strumpack",
    "slepc",
    "tau",
    "hpctoolkit",
];
const PREFIXES: [&str; 5] = ["py-", "r-", "", "perl-", "lib"];
const WORDS: [&str; 12] = [
    "solver", "mesh", "io", "utils", "graph", "sparse", "stats", "plot", "cache", "proto", "geo",
    "json",
];
const COMPILERS: [&str; 4] = [
    "gcc@12.3.0",
    "gcc@13.2.0",
    "clang@17.0.6",
    "oneapi@2024.1.0",
];
const VARIANTS: [&str; 8] = [
    "~debug +shared",
    "~debug +shared",
    "+mpi ~openmp +shared",
    "+mpi +openmp",
    "~shared",
    "+fortran +shared",
    "+cuda +mpi",
    "+pic ~shared",
];

/// GitHub repositories the runs come from, most active first.
const REPOS: usize = 40;
const WORKFLOWS: [&str; 3] = ["CI", "nightly", "release"];
const MATRIX: [&str; 8] = [
    "build",
    "test (ubuntu-22.04, 3.11)",
    "test (ubuntu-22.04, 3.12)",
    "test (ubuntu-24.04, 3.13)",
    "lint",
    "docs",
    "package (x64)",
    "package (arm64)",
];

/// Flavors: name and memory, smallest first.
const FLAVORS: [(&str, u64); 5] = [
    ("small", 4 << 30),
    ("medium", 8 << 30),
    ("large", 16 << 30),
    ("xlarge", 32 << 30),
    ("huge", 128 << 30),
];

/// What month to make.
#[derive(Debug, Clone, PartialEq)]
pub struct MonthSpec {
    /// Jobs before retries (the retried ones come on top, a few per cent).
    pub jobs: usize,
    /// Distinct workloads (Spack specs, and GitHub repository / workflow /
    /// job); each is built at least once when there are jobs enough.
    pub workloads: usize,
    /// Days the jobs are spread over.
    pub days: u32,
    /// When the month ends (nothing happens after it): now, for a
    /// database the console reads.
    pub end: OffsetDateTime,
    /// Seed of every random choice.
    pub seed: u64,
    /// The newest jobs that are still queued (most) or held back by their
    /// forge (a fifth) when the month ends.
    pub open: usize,
    /// Share of the pipelines that are GitHub runs.
    pub github_share: f64,
}

impl MonthSpec {
    /// A busy site's month ending at `end`: 500,000 jobs over 50,000
    /// workloads in 30 days, 300 of them still waiting at the end.
    pub fn busy(end: OffsetDateTime) -> Self {
        Self {
            jobs: 500_000,
            workloads: 50_000,
            days: 30,
            end,
            seed: 1,
            open: 300,
            github_share: 0.15,
        }
    }
}

/// One pipeline (GitLab) or workflow run (GitHub) of the month.
#[derive(Debug, Clone, Copy)]
struct Plan {
    github: bool,
    /// Index of its first job among all the month's base jobs.
    first: u32,
    /// Its jobs.
    len: u16,
    /// Index of its first job among the Spack jobs (GitLab) into
    /// [`Month::spack`].
    spack: u32,
    /// Unix seconds it starts.
    start: i64,
    /// GitLab project index, or GitHub repository.
    project: u16,
    /// GitHub workflow.
    workflow: u8,
}

/// A planned month: which pipelines start when, and which workload each
/// Spack job builds. Its events are made a pipeline at a time.
#[derive(Debug, Clone)]
pub struct Month {
    spec: MonthSpec,
    plans: Vec<Plan>,
    /// Workload rank of each Spack job, in job order.
    spack: Vec<u32>,
    /// Spack workloads (the rest of [`MonthSpec::workloads`] are GitHub's).
    spack_workloads: usize,
    /// Base jobs planned (within a pipeline of [`MonthSpec::jobs`]).
    jobs: usize,
}

/// splitmix64: a well-mixed hash of one number.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A uniform number in `[0, 1)` from a hash.
fn unit(h: u64) -> f64 {
    (h >> 11) as f64 / (1u64 << 53) as f64
}

/// A standard normal number from two hashes (Box-Muller).
fn normal(a: u64, b: u64) -> f64 {
    let u = unit(a).max(1e-12);
    (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * unit(b)).cos()
}

/// A standard normal number from the generator.
fn gauss(rng: &mut StdRng) -> f64 {
    normal(rng.random(), rng.random())
}

/// A rank in `0..n` drawn from a power law of exponent `s` (< 1) over
/// ranks `1..=n`: the inverse of its continuous distribution at `u`.
fn power_rank(u: f64, n: usize, s: f64) -> usize {
    let a = 1.0 - s;
    let top = (n as f64).powf(a);
    let r = ((top - 1.0) * u + 1.0).powf(1.0 / a);
    (r as usize).saturating_sub(1).min(n.saturating_sub(1))
}

/// Exponent of the Spack workloads' power law.
const SKEW: f64 = 0.9;

/// The workload rank `job_id` builds, among `workloads`, with the skew of
/// [`Month`] (a few built very often, a long tail built once or twice);
/// the same for the same job.
pub fn skewed_workload(job_id: u64, workloads: usize) -> usize {
    power_rank(unit(mix(job_id ^ 0x5eed)), workloads.max(1), SKEW)
}

/// Packages among `workloads` Spack workloads: each package has up to 12
/// configurations (3 versions × 4 compilers).
fn packages(workloads: usize) -> usize {
    workloads.div_ceil(12).max(1)
}

/// The name of package `p`.
pub fn package_name(p: usize) -> String {
    match PACKAGES.get(p) {
        Some(name) => (*name).to_owned(),
        None => format!(
            "{}{}{p}",
            PREFIXES[p % PREFIXES.len()],
            WORDS[(p / PREFIXES.len()) % WORDS.len()]
        ),
    }
}

/// The attributes of Spack workload `k` of `workloads` (`package`,
/// `version`, `variants`, `compiler`, `target`): distinct for every `k`,
/// the lowest ranks on the best-known packages.
pub fn spack_workload(k: usize, workloads: usize) -> BTreeMap<String, String> {
    let n = packages(workloads);
    let (p, c) = (k % n, k / n);
    let version = format!("{}.{}.{}", 1 + p % 5, (p / 5) % 10 + c / 4, (p * 7) % 10);
    let variants = VARIANTS[p % VARIANTS.len()];
    let target = if p % 7 == 5 { "aarch64" } else { "x86_64_v3" };
    [
        ("package", package_name(p)),
        ("version", version),
        ("variants", variants.to_owned()),
        ("compiler", COMPILERS[c % COMPILERS.len()].to_owned()),
        ("target", target.to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

/// The workload key of attributes that need no escaping or variant
/// normalization (what [`spack_workload`] and GitHub's make):
/// `name=value` pairs sorted by name, joined with `;`.
pub fn plain_key(attributes: &BTreeMap<String, String>) -> String {
    attributes
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(";")
}

/// The GitHub workload of repository `r`, workflow `w`, matrix job `m`.
fn github_workload(r: usize, w: usize, m: usize) -> BTreeMap<String, String> {
    [
        ("repo", repo_name(r)),
        ("workflow", WORKFLOWS[w].to_owned()),
        ("job", MATRIX[m].to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

/// GitHub repository `r`.
pub fn repo_name(r: usize) -> String {
    const OWNERS: [&str; 4] = ["acme", "acme-labs", "hpc-tools", "sci-data"];
    const NAMES: [&str; 10] = [
        "web", "api", "solver", "docs", "pipeline", "cli", "sdk", "infra", "models", "bench",
    ];
    format!(
        "{}/{}{}",
        OWNERS[r % OWNERS.len()],
        NAMES[(r / OWNERS.len()) % NAMES.len()],
        if r >= OWNERS.len() * NAMES.len() {
            format!("-{r}")
        } else {
            String::new()
        }
    )
}

/// Matrix jobs of repository `r`'s workflow `w`.
fn matrix_len(r: usize, w: usize) -> usize {
    1 + (r * 3 + w * 5) % MATRIX.len()
}

/// GitHub workloads there can be.
const GITHUB_WORKLOADS: usize = REPOS * WORKFLOWS.len() * MATRIX.len();

/// What a workload needs: its typical peak, the limit the allocator gives
/// it (about 3 % of its builds are killed at that limit), how long it runs.
#[derive(Debug, Clone, Copy)]
struct Needs {
    peak: f64,
    limit: u64,
    seconds: f64,
}

fn needs(seed: u64, id: u64, big: bool) -> Needs {
    let h = mix(seed ^ mix(id));
    let z = normal(h, mix(h));
    let z2 = normal(mix(h ^ 1), mix(h ^ 2));
    let median = if big { 6e9 } else { 1.2e9 };
    let peak = (median * (1.1 * z).exp()).clamp(64e6, 100e9);
    // Peaks vary by exp(0.15 z) build to build: a limit 1.35× the typical
    // peak is exceeded by about 2.3 % of builds, 3 % with the spikes.
    let limit = ((peak * 1.35 / 1e8).ceil() * 1e8) as u64;
    let seconds = (240.0 * (1.1 * z2).exp()).clamp(15.0, 4.0 * 3600.0);
    Needs {
        peak,
        limit,
        seconds,
    }
}

/// The flavor covering `limit`.
fn flavor(limit: u64) -> (&'static str, u64) {
    FLAVORS
        .iter()
        .copied()
        .find(|(_, m)| *m >= limit)
        .unwrap_or(FLAVORS[FLAVORS.len() - 1])
}

/// What is known of one job while its events are made.
#[derive(Debug, Clone)]
struct JobPlan {
    forge: Forge,
    instance: &'static str,
    job_id: u64,
    run_attempt: u32,
    pipeline_id: u64,
    project: String,
    project_id: u64,
    name: String,
    stage: String,
    workflow: String,
    labels: Vec<String>,
    pool: &'static str,
    git_ref: String,
    sha: String,
    workload: BTreeMap<String, String>,
    needs: Needs,
    /// The limit it runs with (bumped for a retry).
    limit: u64,
    bumped: bool,
    queued: OffsetDateTime,
    /// Held back by the forge at the end (never runs within the month).
    waiting: bool,
    /// Still queued at the end.
    open: bool,
}

/// How a job ended, for its pipeline's retry.
#[derive(Debug, Clone)]
struct Ended {
    job: JobPlan,
    completed: OffsetDateTime,
    killed: bool,
    peak: u64,
}

/// Builds events, dropping those after the month's end and numbering the
/// rest.
struct Out {
    end: OffsetDateTime,
    events: Vec<Event>,
}

impl Out {
    fn push(&mut self, e: Event) {
        let at = e
            .occurred_at
            .as_ref()
            .and_then(runyard_events::from_timestamp);
        if at.is_some_and(|t| t <= self.end) {
            self.events.push(e);
        }
    }
}

fn envelope(
    forge: Forge,
    instance: &str,
    id: String,
    occurred: OffsetDateTime,
    producer: &str,
    body: Body,
) -> Event {
    Event {
        occurred_at: Some(timestamp(occurred)),
        received_at: Some(timestamp(occurred + Duration::milliseconds(120))),
        source: Some(Source {
            forge: forge as i32,
            instance: instance.into(),
            delivery_id: id.clone(),
            hook_id: "1".into(),
            producer: producer.into(),
        }),
        id,
        body: Some(body),
    }
}

fn secs(d: f64) -> Duration {
    Duration::milliseconds((d * 1000.0) as i64)
}

impl Month {
    /// Plans the month of `spec`.
    pub fn new(spec: MonthSpec) -> Self {
        let mut rng = StdRng::seed_from_u64(mix(spec.seed));
        let span = f64::from(spec.days.max(1)) * 86_400.0;
        let start0 = spec.end.unix_timestamp() as f64 - span;
        let mut plans = Vec::new();
        let (mut jobs, mut spack_jobs) = (0usize, 0usize);
        while jobs < spec.jobs {
            let github = rng.random::<f64>() < spec.github_share;
            let (len, project, workflow) = if github {
                let r = power_rank(rng.random(), REPOS, 0.6);
                let u: f64 = rng.random();
                let w = if u < 0.75 {
                    0
                } else if u < 0.92 {
                    1
                } else {
                    2
                };
                (matrix_len(r, w), r, w)
            } else {
                let u: f64 = rng.random();
                let project = GITLAB_PROJECTS
                    .iter()
                    .position(|(_, _, share)| u < *share)
                    .unwrap_or(0);
                (rng.random_range(4..=40), project, 0)
            };
            let len = len.min(spec.jobs - jobs).max(1);
            plans.push(Plan {
                github,
                first: u32::try_from(jobs).unwrap_or(u32::MAX),
                len: u16::try_from(len).unwrap_or(u16::MAX),
                spack: u32::try_from(spack_jobs).unwrap_or(u32::MAX),
                start: 0,
                project: u16::try_from(project).unwrap_or(0),
                workflow: u8::try_from(workflow).unwrap_or(0),
            });
            jobs += len;
            if !github {
                spack_jobs += len;
            }
        }
        // Starts: spread over the span, busier by day than by night
        // (density ∝ 1 / (1 − ½ cos(2π t / day))), the last one a few
        // minutes before the end.
        let n = plans.len().max(1) as f64;
        for (i, p) in plans.iter_mut().enumerate() {
            let x = (i as f64 + 0.5) / n * span;
            let warped = x - 0.5 * 86_400.0 / std::f64::consts::TAU
                * (std::f64::consts::TAU * x / 86_400.0).sin();
            p.start = (start0 + warped.clamp(0.0, span - 600.0)) as i64;
        }
        let spack_workloads = spec
            .workloads
            .saturating_sub(GITHUB_WORKLOADS.min(spec.workloads / 10))
            .max(1);
        let mut spack: Vec<u32> = (0..spack_jobs)
            .map(|i| {
                if i < spack_workloads {
                    i
                } else {
                    power_rank(rng.random(), spack_workloads, SKEW)
                }
            })
            .map(|k| u32::try_from(k).unwrap_or(u32::MAX))
            .collect();
        spack.shuffle(&mut rng);
        Self {
            spec,
            plans,
            spack,
            spack_workloads,
            jobs,
        }
    }

    /// Its spec.
    pub fn spec(&self) -> &MonthSpec {
        &self.spec
    }

    /// Pipelines and runs: [`Month::pipeline_events`] takes `0..pipelines()`.
    pub fn pipelines(&self) -> usize {
        self.plans.len()
    }

    /// Base jobs (without retries).
    pub fn jobs(&self) -> usize {
        self.jobs
    }

    /// Spack workloads (the rest are GitHub's).
    pub fn spack_workloads(&self) -> usize {
        self.spack_workloads
    }

    /// The attributes of Spack workload `k`.
    pub fn workload(&self, k: usize) -> BTreeMap<String, String> {
        spack_workload(k, self.spack_workloads)
    }

    /// How many Spack jobs build workload `k`.
    pub fn builds_of(&self, k: usize) -> usize {
        self.spack.iter().filter(|&&w| w as usize == k).count()
    }

    fn is_open(&self, index: usize) -> bool {
        index + self.spec.open >= self.jobs
    }

    /// Every event of pipeline (or run) `p`: its jobs', their runners',
    /// their usage reports, its retry and the retry's jobs; those after
    /// the month's end left out.
    pub fn pipeline_events(&self, p: usize) -> Vec<Event> {
        let Some(plan) = self.plans.get(p).copied() else {
            return Vec::new();
        };
        let mut rng = StdRng::seed_from_u64(mix(self.spec.seed ^ mix(p as u64 + 1)));
        let mut out = Out {
            end: self.spec.end,
            events: Vec::new(),
        };
        let start = OffsetDateTime::from_unix_timestamp(plan.start).unwrap_or(self.spec.end);
        let (pipeline_id, project, project_id) = if plan.github {
            (
                GITHUB_RUN0 + p as u64,
                repo_name(plan.project as usize),
                500_000 + u64::from(plan.project),
            )
        } else {
            let (name, id, _) = GITLAB_PROJECTS[plan.project as usize % GITLAB_PROJECTS.len()];
            (GITLAB_PIPELINE0 + p as u64, name.to_owned(), id)
        };
        let pull = rng.random::<f64>() < 0.4;
        let git_ref = match (plan.github, pull) {
            (false, false) => "develop".to_owned(),
            (false, true) => format!("pr{}_{}", 40_000 + p % 9000, WORDS[p % WORDS.len()]),
            (true, false) => "main".to_owned(),
            (true, true) => format!("refs/pull/{}/merge", 1000 + p % 5000),
        };
        let sha = format!("{:040x}", u128::from(mix(self.spec.seed ^ p as u64)));
        let mut ended = Vec::new();
        for j in 0..usize::from(plan.len) {
            let index = plan.first as usize + j;
            let job = self.base_job(
                &plan,
                j,
                index,
                start,
                &mut rng,
                pipeline_id,
                &project,
                project_id,
                &git_ref,
                &sha,
            );
            if let Some(e) = job_events(&mut out, &job, &mut rng) {
                ended.push(e);
            }
        }
        if !plan.github {
            pipeline_observed(
                &mut out,
                pipeline_id,
                &project,
                project_id,
                &git_ref,
                &sha,
                start,
                &ended,
                plan.len,
                "push",
            );
        }
        let killed: Vec<&Ended> = ended.iter().filter(|e| e.killed).collect();
        if let Some(last) = killed.iter().map(|e| e.completed).max() {
            // The whole unit ended: the retry is decided then.
            let finished = ended.iter().map(|e| e.completed).max().unwrap_or(last);
            self.retry(
                &mut out,
                &mut rng,
                &plan,
                p,
                pipeline_id,
                &project,
                project_id,
                &git_ref,
                &sha,
                finished,
                &killed,
            );
        }
        out.events
    }

    #[allow(clippy::too_many_arguments)]
    fn base_job(
        &self,
        plan: &Plan,
        j: usize,
        index: usize,
        start: OffsetDateTime,
        rng: &mut StdRng,
        pipeline_id: u64,
        project: &str,
        project_id: u64,
        git_ref: &str,
        sha: &str,
    ) -> JobPlan {
        let open = self.is_open(index);
        let waiting = open && mix(index as u64).is_multiple_of(5);
        // What differs between a GitHub matrix job and a Spack build.
        let (forge, instance, job_id, name, stage, workflow, labels, pool, workload, needs, queued) =
            if plan.github {
                let (r, w) = (plan.project as usize, plan.workflow as usize);
                let workload = github_workload(r, w, j);
                let id = (r * WORKFLOWS.len() + w) * MATRIX.len() + j;
                let needs = needs(self.spec.seed, 1_000_000_000 + id as u64, false);
                let queued = start + secs(rng.random_range(0.0..5.0));
                (
                    Forge::Github,
                    GITHUB,
                    GITHUB_JOB0 + index as u64,
                    MATRIX[j].to_owned(),
                    String::new(),
                    WORKFLOWS[w].to_owned(),
                    vec!["self-hosted".into(), "linux".into(), "x64".into()],
                    "gh-linux",
                    workload,
                    needs,
                    queued,
                )
            } else {
                let k = self.spack[plan.spack as usize + j] as usize;
                let workload = self.workload(k);
                let cuda = workload["variants"].contains("+cuda");
                let arm = workload["target"] == "aarch64";
                let needs = needs(self.spec.seed, k as u64, cuda);
                let (pool, labels): (&'static str, &[&str]) = if cuda {
                    ("spack-gpu", &["spack", "x86_64_v3", "cuda"])
                } else if arm {
                    ("spack-arm", &["spack", "aarch64"])
                } else {
                    ("spack-x86", &["spack", "x86_64_v3"])
                };
                // Stages of a Spack pipeline: generate, build (most), rebuild
                // index; jobs of later stages wait for the earlier ones.
                let stage = (j * 3) / usize::from(plan.len).max(1);
                let queued = start + secs(stage as f64 * 420.0 + rng.random_range(0.0..90.0));
                let name = format!(
                    "{}@{} {} %{} {}",
                    workload["package"],
                    workload["version"],
                    workload["variants"],
                    workload["compiler"],
                    workload["target"]
                );
                (
                    Forge::Gitlab,
                    GITLAB,
                    GITLAB_JOB0 + index as u64,
                    name,
                    format!("stage-{stage}"),
                    String::new(),
                    labels.iter().map(|l| (*l).to_owned()).collect(),
                    pool,
                    workload,
                    needs,
                    queued,
                )
            };
        JobPlan {
            forge,
            instance,
            job_id,
            run_attempt: 1,
            pipeline_id,
            project: project.to_owned(),
            project_id,
            name,
            stage,
            workflow,
            labels,
            pool,
            git_ref: git_ref.to_owned(),
            sha: sha.to_owned(),
            limit: needs.limit,
            workload,
            needs,
            bumped: false,
            queued: self.queued_by_end(queued, open),
            waiting,
            open,
        }
    }

    /// An open job is queued before the end, whatever its stage.
    fn queued_by_end(&self, queued: OffsetDateTime, open: bool) -> OffsetDateTime {
        if open {
            queued.min(self.spec.end - Duration::seconds(30))
        } else {
            queued
        }
    }

    /// The retry of a unit with OOM-killed jobs: requested, then issued
    /// (with the retried jobs, bumped) or, for one unit in twelve,
    /// refused.
    #[allow(clippy::too_many_arguments)]
    fn retry(
        &self,
        out: &mut Out,
        rng: &mut StdRng,
        plan: &Plan,
        p: usize,
        pipeline_id: u64,
        project: &str,
        project_id: u64,
        git_ref: &str,
        sha: &str,
        finished: OffsetDateTime,
        killed: &[&Ended],
    ) {
        let (forge, instance) = if plan.github {
            (Forge::Github, GITHUB)
        } else {
            (Forge::Gitlab, GITLAB)
        };
        let unit = if plan.github {
            ids::retry_unit_run(pipeline_id, 1)
        } else {
            ids::retry_unit_pipeline(pipeline_id)
        };
        let target = RetryTarget {
            forge: forge as i32,
            instance: instance.into(),
            project_id,
            project: project.into(),
            pipeline_id,
            run_attempt: u32::from(plan.github),
            r#ref: git_ref.into(),
            sha: sha.into(),
            unit: unit.clone(),
        };
        let jobs: Vec<RetryJob> = killed
            .iter()
            .map(|e| RetryJob {
                job: Some(key(e.job.forge, e.job.instance, e.job.job_id)),
                attempt: e.job.run_attempt,
                name: e.job.name.clone(),
                workload_key: plain_key(&e.job.workload),
                oom_streak: 1,
                memory_limit_bytes: Some(e.job.limit),
                peak_memory_bytes: e.peak,
                exit_code: Some(137),
            })
            .collect();
        let strategy = if plan.github {
            "rerun_failed_jobs"
        } else {
            "pipeline"
        };
        let requested = finished + Duration::seconds(20);
        out.push(envelope(
            forge,
            instance,
            ids::retry(forge, instance, &unit, "requested"),
            requested,
            "scaler",
            Body::RetryRequested(RetryRequested {
                target: Some(target.clone()),
                strategy: strategy.into(),
                jobs: jobs.clone(),
            }),
        ));
        let decided = requested + Duration::seconds(3);
        if rng.random_range(0..12) == 0 {
            out.push(envelope(
                forge,
                instance,
                ids::retry(forge, instance, &unit, "refused"),
                decided,
                "scaler",
                Body::RetryRefused(RetryRefused {
                    target: Some(target),
                    reason: "limit_reached".into(),
                    detail: "the workload was OOM-killed 3 times in a row: no further retry".into(),
                    jobs,
                    forge_status: None,
                    forge_calls: 0,
                }),
            ));
            return;
        }
        let retry_pipeline = if plan.github {
            pipeline_id
        } else {
            GITLAB_RETRY_PIPELINE0 + p as u64
        };
        let new_jobs: Vec<JobPlan> = killed
            .iter()
            .map(|e| {
                let index = e.job.job_id
                    - if plan.github {
                        GITHUB_JOB0
                    } else {
                        GITLAB_JOB0
                    };
                JobPlan {
                    job_id: index
                        + if plan.github {
                            GITHUB_RETRY_JOB0
                        } else {
                            GITLAB_RETRY_JOB0
                        },
                    run_attempt: if plan.github { 2 } else { 1 },
                    pipeline_id: retry_pipeline,
                    limit: ((e.job.limit as f64 * 1.6 / 1e8).ceil() * 1e8) as u64,
                    bumped: true,
                    queued: decided + secs(rng.random_range(5.0..40.0)),
                    open: false,
                    waiting: false,
                    ..e.job.clone()
                }
            })
            .collect();
        out.push(envelope(
            forge,
            instance,
            ids::retry(forge, instance, &unit, "issued"),
            decided,
            "scaler",
            Body::RetryIssued(RetryIssued {
                target: Some(target),
                strategy: strategy.into(),
                jobs,
                new_pipeline_id: if plan.github { 0 } else { retry_pipeline },
                new_job_ids: Vec::new(),
                new_sha: sha.into(),
                new_run_attempt: if plan.github { 2 } else { 0 },
                web_url: if plan.github {
                    format!("https://github.com/{project}/actions/runs/{pipeline_id}/attempts/2")
                } else {
                    format!("https://{GITLAB}/{project}/-/pipelines/{retry_pipeline}")
                },
                forge_calls: 1,
                errors: Vec::new(),
                adopted: false,
                note: String::new(),
            }),
        ));
        let mut again = Vec::new();
        for job in &new_jobs {
            if let Some(e) = job_events(out, job, rng) {
                again.push(e);
            }
        }
        if !plan.github {
            let start = decided + Duration::seconds(2);
            pipeline_observed(
                out,
                retry_pipeline,
                project,
                project_id,
                git_ref,
                sha,
                start,
                &again,
                u16::try_from(new_jobs.len()).unwrap_or(u16::MAX),
                "api",
            );
        }
    }
}

fn key(forge: Forge, instance: &str, job_id: u64) -> JobKey {
    JobKey {
        forge: forge as i32,
        instance: instance.into(),
        job_id,
    }
}

/// A pipeline's webhooks: created, and finished once all its jobs did.
#[allow(clippy::too_many_arguments)]
fn pipeline_observed(
    out: &mut Out,
    pipeline_id: u64,
    project: &str,
    project_id: u64,
    git_ref: &str,
    sha: &str,
    start: OffsetDateTime,
    ended: &[Ended],
    jobs: u16,
    source: &str,
) {
    let observed = |status: &str, finished: Option<OffsetDateTime>| {
        Body::PipelineObserved(PipelineObserved {
            forge: Forge::Gitlab as i32,
            instance: GITLAB.into(),
            pipeline_id,
            project_id,
            project: project.into(),
            r#ref: git_ref.into(),
            sha: sha.into(),
            tag: false,
            status: status.into(),
            pipeline_source: source.into(),
            created_at: Some(timestamp(start)),
            finished_at: finished.map(timestamp),
            duration_seconds: finished.map(|f| (f - start).as_seconds_f64()),
            queued_duration_seconds: None,
            job_ids: Vec::new(),
            web_url: format!("https://{GITLAB}/{project}/-/pipelines/{pipeline_id}"),
            parent_pipeline_id: 0,
            parent_project_id: 0,
        })
    };
    let delivery = format!("month-pipeline-{pipeline_id}");
    out.push(envelope(
        Forge::Gitlab,
        GITLAB,
        ids::gitlab_pipeline(&delivery, pipeline_id, "pending"),
        start,
        "ingest",
        observed("pending", None),
    ));
    if ended.len() == usize::from(jobs)
        && let Some(finished) = ended.iter().map(|e| e.completed).max()
    {
        let status = if ended.iter().any(|e| e.killed) {
            "failed"
        } else {
            "success"
        };
        out.push(envelope(
            Forge::Gitlab,
            GITLAB,
            ids::gitlab_pipeline(&delivery, pipeline_id, status),
            finished + Duration::seconds(2),
            "ingest",
            observed(status, Some(finished)),
        ));
    }
}

/// One job's events: its webhooks, its runner's, its usage report.
/// `Some` when it completed within the month.
fn job_events(out: &mut Out, job: &JobPlan, rng: &mut StdRng) -> Option<Ended> {
    let forge = job.forge;
    let claim = runyard_events::claim_key(forge, job.instance, job.job_id, job.run_attempt);
    let runner_name = runyard_events::instance_name(job.pool, &claim);
    let (flavor_name, flavor_memory) = flavor(job.limit);
    // The runner: requested at once, made in seconds (one create in fifty
    // fails first and is made on the second attempt), online in ten.
    let requested = job.queued + Duration::milliseconds(300);
    let create_fails = rng.random_range(0..50) == 0;
    let created =
        requested + secs(rng.random_range(3.0..6.0) + if create_fails { 18.0 } else { 0.0 });
    let online = created + secs(rng.random_range(8.0..20.0));
    let wait = (12.0 * (1.2 * gauss(rng)).exp()).clamp(3.0, 3.0 * 3600.0);
    let started = (job.queued + secs(wait)).max(online + Duration::seconds(2));
    let noise = (0.15 * gauss(rng)).exp()
        * if rng.random_range(0..200) == 0 {
            1.7
        } else {
            1.0
        };
    let peak = job.needs.peak * noise;
    let killed = peak > job.limit as f64;
    let mut run = job.needs.seconds * (0.2 * gauss(rng)).exp();
    if killed {
        run *= rng.random_range(0.3..0.9);
    }
    let completed = started + secs(run);
    let failed = killed || rng.random_range(0..40) == 0;

    let rref = || {
        Some(RunnerRef {
            pool: job.pool.into(),
            name: runner_name.clone(),
            pool_id: format!("pool-{}", job.pool),
            provider: "openstack".into(),
            forge: forge as i32,
            instance: job.instance.into(),
        })
    };
    let jkey = || Some(key(forge, job.instance, job.job_id));
    let runner_event = |body: Body, t: OffsetDateTime| {
        let id = runyard_events::runner_event_id_for(&body).unwrap_or_default();
        envelope(forge, job.instance, id, t, "scaler", body)
    };
    let observed = |status: JobStatus, word: &str, at: OffsetDateTime| {
        let running = matches!(status, JobStatus::InProgress | JobStatus::Completed);
        let done = status == JobStatus::Completed;
        let conclusion = match (done, failed) {
            (false, _) => Conclusion::Unspecified,
            (true, false) => Conclusion::Success,
            (true, true) => Conclusion::Failure,
        };
        let body = Body::JobObserved(JobObserved {
            job: jkey(),
            project: job.project.clone(),
            project_id: job.project_id,
            pipeline_id: job.pipeline_id,
            run_attempt: job.run_attempt,
            name: job.name.clone(),
            stage: job.stage.clone(),
            workflow_name: job.workflow.clone(),
            labels: job.labels.clone(),
            status: status as i32,
            forge_status: word.into(),
            conclusion: conclusion as i32,
            failure_reason: if done && failed && forge == Forge::Gitlab {
                "script_failure".into()
            } else {
                String::new()
            },
            runner_id: running.then_some(job.job_id % 100_000 + 1),
            runner_name: if running {
                runner_name.clone()
            } else {
                String::new()
            },
            r#ref: job.git_ref.clone(),
            sha: job.sha.clone(),
            created_at: Some(timestamp(job.queued)),
            started_at: running.then(|| timestamp(started)),
            completed_at: done.then(|| timestamp(completed)),
            duration_seconds: done.then(|| (completed - started).as_seconds_f64()),
            queued_duration_seconds: running.then(|| (started - job.queued).as_seconds_f64()),
            html_url: if forge == Forge::Gitlab {
                format!("https://{GITLAB}/{}/-/jobs/{}", job.project, job.job_id)
            } else {
                format!(
                    "https://github.com/{}/actions/runs/{}/job/{}",
                    job.project, job.pipeline_id, job.job_id
                )
            },
            organization: if forge == Forge::Github {
                job.project.split('/').next().unwrap_or_default().into()
            } else {
                String::new()
            },
            ..Default::default()
        });
        let id = if forge == Forge::Gitlab {
            ids::gitlab_job(&format!("month-{}-{word}", job.job_id), job.job_id, word)
        } else {
            ids::github(&format!("month-{}-{word}", job.job_id))
        };
        envelope(forge, job.instance, id, at, "ingest", body)
    };

    if job.waiting {
        out.push(observed(
            JobStatus::Waiting,
            "waiting_for_resource",
            job.queued,
        ));
        return None;
    }
    let queued_word = if forge == Forge::Gitlab {
        "pending"
    } else {
        "queued"
    };
    out.push(observed(JobStatus::Queued, queued_word, job.queued));

    // An open job: a fifth have no runner yet (the pool is full), a few
    // were given up after three failed creates, the rest have one
    // requested, made or online but not handed the job.
    let fate = if job.open { mix(job.job_id) % 20 } else { 99 };
    if fate < 4 {
        return None;
    }
    let requested_event = runner_event(
        Body::RunnerRequested(RunnerRequested {
            runner: rref(),
            job: jkey(),
            run_attempt: job.run_attempt,
            claim_key: claim.clone(),
            reason: "queued_job".into(),
            flavor: flavor_name.into(),
            memory_bytes: flavor_memory,
            cpus: if flavor_memory >= 32 << 30 { 16 } else { 4 },
            recommended_memory_limit_bytes: Some(job.limit),
            allocator_unavailable: false,
            workload_key: plain_key(&job.workload),
            labels: job.labels.clone(),
            image: String::new(),
            recommendation: Some(Recommended {
                memory_limit_bytes: job.limit,
                memory_request_bytes: job.limit / 2,
                statistic: "lognormal-q0.970".into(),
                samples: 5 + (mix(job.job_id) % 40) as u32,
                workload_samples: 3 + (mix(job.job_id) % 20) as u32,
                oom_probability: 0.03,
                oom_bump: job.bumped,
                retry_count: u32::from(job.bumped),
            }),
        }),
        requested,
    );
    out.push(requested_event);
    let failure = |attempt: u32, given_up: bool, t: OffsetDateTime| {
        runner_event(
            Body::RunnerFailed(RunnerFailed {
                runner: rref(),
                reason: if given_up { "gave_up" } else { "create_failed" }.into(),
                error: if given_up {
                    format!("no runner after {attempt} attempts")
                } else {
                    "provider: quota exceeded for instances (InstanceLimitExceeded)".into()
                },
                attempt,
                given_up,
                job: jkey(),
            }),
            t,
        )
    };
    if fate == 4 {
        for attempt in 1..=3 {
            out.push(failure(
                attempt,
                false,
                requested + Duration::seconds(5 * i64::from(attempt)),
            ));
        }
        out.push(failure(3, true, requested + Duration::seconds(16)));
        return None;
    }
    if fate < 9 && job.open {
        return None;
    }
    if create_fails {
        out.push(failure(1, false, requested + Duration::seconds(4)));
    }
    let attempt = if create_fails { 2 } else { 1 };
    out.push(runner_event(
        Body::RunnerCreated(RunnerCreated {
            runner: rref(),
            provider_id: format!("i-{:012x}", mix(job.job_id) >> 16),
            forge_runner_id: Some(job.job_id % 1_000_000 + 1),
            attempt,
            status: "running".into(),
        }),
        created,
    ));
    if job.open && fate < 14 {
        return None;
    }
    out.push(runner_event(
        Body::RunnerOnline(RunnerOnline {
            runner: rref(),
            source: "callback".into(),
        }),
        online,
    ));
    if job.open {
        return None;
    }
    out.push(runner_event(
        Body::RunnerAssigned(RunnerAssigned {
            runner: rref(),
            job: jkey(),
        }),
        started - Duration::seconds(1),
    ));
    out.push(observed(
        JobStatus::InProgress,
        if forge == Forge::Gitlab {
            "running"
        } else {
            "in_progress"
        },
        started,
    ));
    let done_word = match (forge, failed) {
        (Forge::Gitlab, false) => "success",
        (Forge::Gitlab, true) => "failed",
        _ => "completed",
    };
    out.push(observed(JobStatus::Completed, done_word, completed));
    out.push(runner_event(
        Body::RunnerDeleted(RunnerDeleted {
            runner: rref(),
            reason: "job_completed".into(),
        }),
        completed + Duration::seconds(3),
    ));
    let reported_peak = if killed {
        job.limit
    } else {
        (peak as u64).min(job.limit)
    };
    let attempt = job.run_attempt;
    let id = ids::usage(forge, job.instance, job.job_id, attempt);
    out.push(envelope(
        forge,
        job.instance,
        id,
        completed + Duration::seconds(1),
        "ingest",
        Body::UsageReported(UsageReported {
            job: jkey(),
            attempt,
            r#ref: job.git_ref.clone(),
            workload: job.workload.clone().into_iter().collect(),
            peak_memory_bytes: reported_peak,
            memory_request_bytes: Some(job.limit / 2),
            memory_limit_bytes: Some(job.limit),
            cpu_seconds: run * 3.2,
            wall_seconds: run,
            cpu_request_millicores: Some(4000),
            oom_killed: killed,
            exit_code: Some(if killed {
                137
            } else if failed {
                1
            } else {
                0
            }),
            project: job.project.clone(),
            cgroup: "v2".into(),
            identity: None,
        }),
    ));
    (completed <= out.end).then(|| Ended {
        job: job.clone(),
        completed,
        killed,
        peak: reported_peak,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> Month {
        Month::new(MonthSpec {
            jobs: 3000,
            workloads: 600,
            days: 3,
            end: crate::synth::base_time(),
            seed: 7,
            open: 40,
            github_share: 0.2,
        })
    }

    #[test]
    fn a_pipeline_is_the_same_whenever_it_is_made() {
        let (a, b) = (small(), small());
        for p in [0, 7, a.pipelines() - 1] {
            assert_eq!(a.pipeline_events(p), b.pipeline_events(p));
        }
    }

    #[test]
    fn the_month_has_its_jobs_workloads_kills_retries_and_open_jobs() {
        let m = small();
        let end = m.spec().end;
        let events: Vec<Event> = (0..m.pipelines())
            .flat_map(|p| m.pipeline_events(p))
            .collect();
        assert!(events.iter().all(|e| {
            e.occurred_at
                .as_ref()
                .and_then(runyard_events::from_timestamp)
                .is_some_and(|t| t <= end)
        }));
        let mut ids: Vec<&str> = events.iter().map(|e| e.id.as_str()).collect();
        ids.sort_unstable();
        let n = ids.len();
        ids.dedup();
        assert_eq!(ids.len(), n, "event ids are unique");
        let count = |f: fn(&Body) -> bool| {
            events
                .iter()
                .filter(|e| e.body.as_ref().is_some_and(f))
                .count()
        };
        let usage = count(|b| matches!(b, Body::UsageReported(_)));
        let killed = count(|b| matches!(b, Body::UsageReported(u) if u.oom_killed));
        assert!(usage > 2500, "{usage}");
        let share = killed as f64 / usage as f64;
        assert!((0.01..0.08).contains(&share), "{share}");
        assert!(count(|b| matches!(b, Body::RetryIssued(_))) > 10);
        assert!(count(|b| matches!(b, Body::RunnerFailed(_))) > 10);
        let workloads: std::collections::BTreeSet<String> = events
            .iter()
            .filter_map(|e| match &e.body {
                Some(Body::UsageReported(u)) => Some(format!(
                    "{:?}",
                    u.workload.iter().collect::<BTreeMap<_, _>>()
                )),
                _ => None,
            })
            .collect();
        assert!(workloads.len() > 450, "{}", workloads.len());
        // The newest jobs are still open: their last webhook is queued or
        // waiting.
        let mut last: BTreeMap<u64, i32> = BTreeMap::new();
        for e in &events {
            if let Some(Body::JobObserved(j)) = &e.body {
                let s = last
                    .entry(j.job.as_ref().map_or(0, |k| k.job_id))
                    .or_default();
                *s = (*s).max(j.status);
            }
        }
        let open = last
            .values()
            .filter(|s| **s <= JobStatus::Waiting as i32)
            .count();
        assert!((40..200).contains(&open), "{open}");
    }

    #[test]
    fn skewed_workloads_have_a_busy_head_and_a_long_tail() {
        let n = 5000;
        let mut counts = vec![0usize; n];
        for job in 0..100_000u64 {
            counts[skewed_workload(job, n)] += 1;
        }
        assert!(counts[0] > 1500, "{}", counts[0]);
        let rare = counts.iter().filter(|c| **c <= 5).count();
        assert!(rare > n / 3, "{rare}");
        assert_ne!(spack_workload(0, n), spack_workload(1, n));
        let spread =
            |job| match crate::synth::usage_event_spread(job, crate::synth::base_time(), n).body {
                Some(Body::UsageReported(u)) => u.workload.get("package").cloned(),
                _ => None,
            };
        assert!(spread(7).is_some());
        assert_eq!(spread(7), spread(7));
        assert_ne!(spack_workload(0, n), spack_workload(n / 12 + 1, n));
    }
}
