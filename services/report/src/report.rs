//! The usage report and how it is assembled from flags, CI variables and
//! cgroup data. Everything here is pure: the environment comes in as a
//! lookup function and "now" as a value, so tests never touch the process.

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::Error;
use crate::cgroup::{CgroupUsage, CgroupVersion};
use crate::quantity::{parse_cpu, parse_quantity};

/// The forge a job ran on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Forge {
    /// GitHub Actions (github.com or GitHub Enterprise Server).
    Github,
    /// GitLab CI.
    Gitlab,
}

impl fmt::Display for Forge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Forge::Github => "github",
            Forge::Gitlab => "gitlab",
        })
    }
}

/// The body of `POST /v1/usage` (ARCHITECTURE.md, "Ingest HTTP API").
///
/// Unknown optional values are left out of the JSON rather than sent as 0,
/// so that "no limit" and "unknown" never read as "zero bytes".
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// `github` or `gitlab`.
    pub forge: Forge,
    /// Host of the forge (`github.com`, `gitlab.example.com`).
    pub instance: String,
    /// GitHub `workflow_job.id` / GitLab build id.
    pub job_id: u64,
    /// Run attempt (GitHub `GITHUB_RUN_ATTEMPT`; 1 on GitLab, where a retry
    /// is a new job id).
    pub attempt: u32,
    /// Branch or tag the job ran for.
    #[serde(rename = "ref", skip_serializing_if = "Option::is_none")]
    pub git_ref: Option<String>,
    /// Repository / project path, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
    /// Workload attributes that identify "the same job" across runs.
    pub workload: BTreeMap<String, String>,
    /// High-water mark of memory use, bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_memory_bytes: Option<u64>,
    /// Memory request the job ran with, bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_request_bytes: Option<u64>,
    /// Memory limit the job ran under, bytes; absent when unlimited.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_limit_bytes: Option<u64>,
    /// CPU time used, seconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_seconds: Option<f64>,
    /// Wall-clock duration of the job, seconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wall_seconds: Option<f64>,
    /// CPU request the job ran with, millicores.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_request_millicores: Option<u64>,
    /// Whether the job (or a process in it) was killed for running out of
    /// memory.
    pub oom_killed: bool,
    /// The job's exit code, when the caller passed it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// The cgroup hierarchy (`v1` or `v2`) the memory figures came from;
    /// absent when there was no cgroup data. With it, `oom_killed` is the
    /// cgroup's own verdict.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<CgroupVersion>,
}

/// What the caller said explicitly (flags, or the runyard/Kubernetes
/// variables clap reads for them). Strings are parsed here, not by clap, so
/// that a bad value is a report error that `--fail-on-error` governs.
#[derive(Debug, Clone, Default)]
pub struct ReportInputs {
    /// `--forge`; detected from the CI variables when `None`.
    pub forge: Option<Forge>,
    /// `--instance` (a host, or a URL whose host is taken).
    pub instance: Option<String>,
    /// `--job-id` / `RUNYARD_JOB_ID`.
    pub job_id: Option<String>,
    /// `--attempt`.
    pub attempt: Option<u32>,
    /// `--ref`.
    pub git_ref: Option<String>,
    /// `--project`.
    pub project: Option<String>,
    /// `--workload` specs (`k=v,k=v`), or `RUNYARD_WORKLOAD`.
    pub workload: Vec<String>,
    /// `--memory-request-bytes` / `KUBERNETES_MEMORY_REQUEST` (a quantity).
    pub memory_request: Option<String>,
    /// `--memory-limit-bytes` / `KUBERNETES_MEMORY_LIMIT`; used only when the
    /// cgroup has no limit to say.
    pub memory_limit: Option<String>,
    /// `--cpu-request` / `KUBERNETES_CPU_REQUEST` (`1200m`, `2`, `0.5`).
    pub cpu_request: Option<String>,
    /// `--peak-memory-bytes`: a peak measured elsewhere (by the runner);
    /// overrides `memory.peak`.
    pub peak_memory: Option<String>,
    /// `--cpu-seconds`: overrides `cpu.stat`.
    pub cpu_seconds: Option<f64>,
    /// `--oom-killed`: the caller knows the job was OOM-killed.
    pub oom_killed: bool,
    /// `--exit-code` / `RUNYARD_JOB_EXIT_CODE`.
    pub exit_code: Option<String>,
    /// `--wall-seconds`.
    pub wall_seconds: Option<f64>,
    /// `--started-at` / `CI_JOB_STARTED_AT` (RFC 3339).
    pub started_at: Option<String>,
}

/// Whether the job was OOM-killed.
///
/// The cgroup's `oom_kill` counter is authoritative whenever it was read: a
/// kill counts even if the job then exited 0, and exit 137 without a kill is
/// a plain SIGKILL. Only when it is unknown does the fallback apply: exit
/// code 137 (SIGKILL) with the peak at ≥ 95% of the limit.
pub fn detect_oom(
    oom_kills: Option<u64>,
    exit_code: Option<i32>,
    peak_memory_bytes: Option<u64>,
    memory_limit_bytes: Option<u64>,
) -> bool {
    if let Some(kills) = oom_kills {
        return kills > 0;
    }
    match (exit_code, peak_memory_bytes, memory_limit_bytes) {
        (Some(137), Some(peak), Some(limit)) if limit > 0 => {
            u128::from(peak) * 100 >= u128::from(limit) * 95
        }
        _ => false,
    }
}

/// Parses a workload spec `k=v,k=v` into attribute pairs.
///
/// Keys and values are trimmed; empty pieces (a trailing comma) are skipped;
/// `\,` is a literal comma and `\\` a literal backslash, for Spack variants
/// such as `cuda_arch=80\,90`. A value may contain `=`. A piece without `=`
/// or with an empty key is an error naming the piece.
pub fn parse_workload(spec: &str) -> Result<Vec<(String, String)>, Error> {
    let mut pieces = vec![String::new()];
    let mut chars = spec.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(escaped @ (',' | '\\')) => push_char(&mut pieces, escaped),
                Some(other) => {
                    push_char(&mut pieces, '\\');
                    push_char(&mut pieces, other);
                }
                None => push_char(&mut pieces, '\\'),
            },
            ',' => pieces.push(String::new()),
            c => push_char(&mut pieces, c),
        }
    }
    pieces
        .iter()
        .filter(|piece| !piece.trim().is_empty())
        .map(|piece| match piece.split_once('=') {
            Some((key, value)) if !key.trim().is_empty() => {
                Ok((key.trim().to_owned(), value.trim().to_owned()))
            }
            _ => Err(Error::WorkloadPair {
                pair: piece.trim().to_owned(),
            }),
        })
        .collect()
}

fn push_char(pieces: &mut [String], c: char) {
    if let Some(last) = pieces.last_mut() {
        last.push(c);
    }
}

/// The forge named by the CI variables: `GITLAB_CI=true` → GitLab,
/// `GITHUB_ACTIONS=true` → GitHub.
pub fn detect_forge(env: impl Fn(&str) -> Option<String>) -> Option<Forge> {
    if env("GITLAB_CI").as_deref() == Some("true") {
        Some(Forge::Gitlab)
    } else if env("GITHUB_ACTIONS").as_deref() == Some("true") {
        Some(Forge::Github)
    } else {
        None
    }
}

/// The host part of `value` if it is a URL, else `value` itself.
fn host_of(value: &str) -> Option<String> {
    let value = value.trim();
    if value.contains("://") {
        reqwest::Url::parse(value)
            .ok()?
            .host_str()
            .map(str::to_owned)
    } else if value.is_empty() {
        None
    } else {
        Some(value.to_ascii_lowercase())
    }
}

/// Assembles the report. `env` looks up CI variables (empty values count as
/// unset); `now` ends the wall-clock span started at `--started-at`.
///
/// Precedence: an explicit input wins over the CI variables; for the memory
/// limit the cgroup's `memory.max` wins over the input, because it is what
/// the kernel enforced; for peak and CPU time the input wins, because it is
/// only given when the caller measured them itself. `cgroup` names the
/// hierarchy the cgroup figures came from ([`CgroupUsage::version`]).
pub fn build_report(
    inputs: &ReportInputs,
    cgroup: &CgroupUsage,
    env: impl Fn(&str) -> Option<String>,
    now: OffsetDateTime,
) -> Result<Report, Error> {
    let env = |key: &str| env(key).filter(|value| !value.trim().is_empty());
    let forge = inputs
        .forge
        .or_else(|| detect_forge(env))
        .ok_or(Error::UnknownForge)?;

    let instance = match (&inputs.instance, forge) {
        (Some(instance), _) => host_of(instance),
        (None, Forge::Gitlab) => env("CI_SERVER_URL")
            .and_then(|url| host_of(&url))
            .or_else(|| env("CI_SERVER_HOST")),
        (None, Forge::Github) => Some(
            env("GITHUB_SERVER_URL")
                .and_then(|url| host_of(&url))
                .unwrap_or_else(|| "github.com".to_owned()),
        ),
    }
    .ok_or(Error::Missing {
        what: "instance",
        hint: "pass --instance or set CI_SERVER_URL / CI_SERVER_HOST",
    })?;

    let job_id = match (&inputs.job_id, forge) {
        (Some(id), _) => Some(id.clone()),
        (None, Forge::Gitlab) => env("CI_JOB_ID"),
        (None, Forge::Github) => None,
    };
    let job_id = match (job_id, forge) {
        (Some(id), _) => parse_field("job_id", &id)?,
        (None, Forge::Gitlab) => {
            return Err(Error::Missing {
                what: "job_id",
                hint: "pass --job-id or set RUNYARD_JOB_ID or CI_JOB_ID",
            });
        }
        (None, Forge::Github) => {
            return Err(Error::Missing {
                what: "job_id",
                hint: "GitHub Actions does not put the numeric job id in the environment; \
                       pass --job-id or set RUNYARD_JOB_ID (e.g. to ${{ job.check_run_id }})",
            });
        }
    };

    let attempt = match (inputs.attempt, forge) {
        (Some(attempt), _) => attempt,
        (None, Forge::Github) => env("GITHUB_RUN_ATTEMPT")
            .map(|a| parse_field("attempt", &a))
            .transpose()?
            .unwrap_or(1),
        (None, Forge::Gitlab) => 1,
    };
    if attempt == 0 {
        return Err(Error::InvalidValue {
            field: "attempt",
            value: "0".to_owned(),
            reason: "attempts count from 1".to_owned(),
        });
    }

    let (ref_var, project_var) = match forge {
        Forge::Gitlab => ("CI_COMMIT_REF_NAME", "CI_PROJECT_PATH"),
        Forge::Github => ("GITHUB_REF_NAME", "GITHUB_REPOSITORY"),
    };
    let git_ref = inputs.git_ref.clone().or_else(|| env(ref_var));
    let project = inputs.project.clone().or_else(|| env(project_var));

    let mut workload = BTreeMap::new();
    for spec in &inputs.workload {
        workload.extend(parse_workload(spec)?);
    }
    if workload.is_empty() {
        let defaults: &[(&str, &str)] = match forge {
            Forge::Github => &[
                ("repo", "GITHUB_REPOSITORY"),
                ("workflow", "GITHUB_WORKFLOW"),
                ("job", "GITHUB_JOB"),
            ],
            Forge::Gitlab => &[("project", "CI_PROJECT_PATH"), ("job", "CI_JOB_NAME")],
        };
        workload.extend(
            defaults
                .iter()
                .filter_map(|(key, var)| Some(((*key).to_owned(), env(var)?))),
        );
    }

    let memory_request_bytes = inputs
        .memory_request
        .as_deref()
        .map(parse_quantity)
        .transpose()?;
    let memory_limit_bytes = match cgroup.memory_limit_bytes {
        Some(limit) => Some(limit),
        None => inputs
            .memory_limit
            .as_deref()
            .map(parse_quantity)
            .transpose()?,
    };
    let peak_memory_bytes = match inputs.peak_memory.as_deref() {
        Some(peak) => Some(parse_quantity(peak)?),
        None => cgroup.peak_memory_bytes,
    };
    let cpu_request_millicores = inputs.cpu_request.as_deref().map(parse_cpu).transpose()?;
    let cpu_seconds = match inputs.cpu_seconds {
        Some(seconds) => Some(non_negative("cpu_seconds", seconds)?),
        None => cgroup.cpu_usage_usec.map(|usec| usec as f64 / 1e6),
    };
    let exit_code = inputs
        .exit_code
        .as_deref()
        .map(|code| parse_field("exit_code", code))
        .transpose()?;

    let wall_seconds = match (inputs.wall_seconds, inputs.started_at.as_deref()) {
        (Some(seconds), _) => Some(non_negative("wall_seconds", seconds)?),
        (None, Some(started_at)) => {
            let started = OffsetDateTime::parse(started_at.trim(), &Rfc3339).map_err(|e| {
                Error::InvalidValue {
                    field: "started_at",
                    value: started_at.to_owned(),
                    reason: e.to_string(),
                }
            })?;
            // A clock skewed between the forge and the runner must not make
            // a negative duration.
            let seconds = (now - started).as_seconds_f64().max(0.0);
            Some((seconds * 1000.0).round() / 1000.0)
        }
        (None, None) => None,
    };

    let oom_killed = inputs.oom_killed
        || detect_oom(
            cgroup.oom_kills,
            exit_code,
            peak_memory_bytes,
            memory_limit_bytes,
        );

    Ok(Report {
        forge,
        instance,
        job_id,
        attempt,
        git_ref,
        project,
        workload,
        peak_memory_bytes,
        memory_request_bytes,
        memory_limit_bytes,
        cpu_seconds,
        wall_seconds,
        cpu_request_millicores,
        oom_killed,
        exit_code,
        cgroup: cgroup.version,
    })
}

fn parse_field<T: std::str::FromStr>(field: &'static str, value: &str) -> Result<T, Error>
where
    T::Err: fmt::Display,
{
    value
        .trim()
        .parse()
        .map_err(|e: T::Err| Error::InvalidValue {
            field,
            value: value.to_owned(),
            reason: e.to_string(),
        })
}

fn non_negative(field: &'static str, value: f64) -> Result<f64, Error> {
    if value.is_finite() && value >= 0.0 {
        Ok(value)
    } else {
        Err(Error::InvalidValue {
            field,
            value: value.to_string(),
            reason: "must be a non-negative number".to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use time::macros::datetime;

    use super::*;

    const GIB: u64 = 1 << 30;

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |key| map.get(key).cloned()
    }

    fn now() -> OffsetDateTime {
        datetime!(2025-06-01 12:15:00 UTC)
    }

    const GITLAB_ENV: &[(&str, &str)] = &[
        ("GITLAB_CI", "true"),
        ("CI_SERVER_URL", "https://gitlab.example.com:8443"),
        ("CI_SERVER_HOST", "ignored.example.com"),
        ("CI_JOB_ID", "4711"),
        ("CI_COMMIT_REF_NAME", "develop"),
        ("CI_PROJECT_PATH", "spack/spack"),
        ("CI_JOB_NAME", "build py-torch"),
        ("CI_JOB_STARTED_AT", "2025-06-01T12:00:00Z"),
    ];

    const GITHUB_ENV: &[(&str, &str)] = &[
        ("GITHUB_ACTIONS", "true"),
        ("GITHUB_SERVER_URL", "https://github.com"),
        ("GITHUB_RUN_ATTEMPT", "2"),
        ("GITHUB_REF_NAME", "main"),
        ("GITHUB_REPOSITORY", "acme/app"),
        ("GITHUB_WORKFLOW", "CI"),
        ("GITHUB_JOB", "test"),
    ];

    #[test]
    fn oom_fallback_needs_137_and_a_peak_near_the_limit() {
        let limit = Some(10 * GIB);
        let peak_96 = Some(10 * GIB / 100 * 96);
        let peak_50 = Some(5 * GIB);
        assert!(detect_oom(None, Some(137), peak_96, limit));
        assert!(!detect_oom(None, Some(137), peak_50, limit));
        assert!(!detect_oom(None, Some(1), peak_96, limit));
        assert!(!detect_oom(None, Some(137), peak_96, None));
        assert!(!detect_oom(None, Some(137), None, limit));
        assert!(!detect_oom(None, None, peak_96, limit));
        // Exactly 95% counts.
        assert!(detect_oom(None, Some(137), Some(95), Some(100)));
    }

    #[test]
    fn cgroup_oom_kill_is_authoritative() {
        let limit = Some(10 * GIB);
        assert!(detect_oom(Some(3), Some(0), Some(GIB), limit));
        assert!(detect_oom(Some(1), None, None, None));
        // Read and zero: a SIGKILL near the limit was not the OOM killer.
        assert!(!detect_oom(Some(0), Some(137), Some(10 * GIB), limit));
    }

    #[test]
    fn workload_pairs() {
        let pairs = parse_workload(
            "package=py-torch, version=2.3.1,variants=+cuda cuda_arch=80\\,90,,compiler=gcc,",
        )
        .expect("valid spec");
        assert_eq!(
            pairs,
            vec![
                ("package".to_owned(), "py-torch".to_owned()),
                ("version".to_owned(), "2.3.1".to_owned()),
                ("variants".to_owned(), "+cuda cuda_arch=80,90".to_owned()),
                ("compiler".to_owned(), "gcc".to_owned()),
            ]
        );
        assert_eq!(parse_workload("").expect("empty spec"), vec![]);
        assert_eq!(
            parse_workload("path=C:\\x").expect("lone backslash"),
            vec![("path".to_owned(), "C:\\x".to_owned())]
        );
    }

    #[test]
    fn bad_workload_pair_is_named() {
        let err = parse_workload("package=zlib,oops").expect_err("no =");
        assert!(matches!(&err, Error::WorkloadPair { pair } if pair == "oops"));
        assert!(err.to_string().contains("\"oops\""), "{err}");
        let err = parse_workload("=value").expect_err("empty key");
        assert!(matches!(&err, Error::WorkloadPair { pair } if pair == "=value"));
    }

    #[test]
    fn forge_detection() {
        assert_eq!(detect_forge(env_of(GITLAB_ENV)), Some(Forge::Gitlab));
        assert_eq!(detect_forge(env_of(GITHUB_ENV)), Some(Forge::Github));
        assert_eq!(detect_forge(env_of(&[("GITLAB_CI", "false")])), None);
        assert_eq!(detect_forge(env_of(&[])), None);
    }

    #[test]
    fn gitlab_defaults_from_environment() {
        let cgroup = CgroupUsage {
            version: Some(CgroupVersion::V2),
            peak_memory_bytes: Some(9_123_456_789),
            memory_limit_bytes: Some(12_000_000_000),
            oom_kills: Some(0),
            cpu_usage_usec: Some(5_400_500_000),
        };
        let inputs = ReportInputs {
            memory_request: Some("8000M".to_owned()),
            cpu_request: Some("8".to_owned()),
            started_at: env_of(GITLAB_ENV)("CI_JOB_STARTED_AT"),
            exit_code: Some("0".to_owned()),
            ..ReportInputs::default()
        };
        let report = build_report(&inputs, &cgroup, env_of(GITLAB_ENV), now()).expect("report");
        assert_eq!(
            report,
            Report {
                forge: Forge::Gitlab,
                instance: "gitlab.example.com".to_owned(),
                job_id: 4711,
                attempt: 1,
                git_ref: Some("develop".to_owned()),
                project: Some("spack/spack".to_owned()),
                workload: BTreeMap::from([
                    ("project".to_owned(), "spack/spack".to_owned()),
                    ("job".to_owned(), "build py-torch".to_owned()),
                ]),
                peak_memory_bytes: Some(9_123_456_789),
                memory_request_bytes: Some(8_000_000_000),
                memory_limit_bytes: Some(12_000_000_000),
                cpu_seconds: Some(5400.5),
                wall_seconds: Some(900.0),
                cpu_request_millicores: Some(8000),
                oom_killed: false,
                exit_code: Some(0),
                cgroup: Some(CgroupVersion::V2),
            }
        );
    }

    #[test]
    fn cgroup_version_is_named_only_with_cgroup_data() {
        let env = env_of(GITLAB_ENV);
        let inputs = ReportInputs::default();
        let v1 = CgroupUsage {
            version: Some(CgroupVersion::V1),
            peak_memory_bytes: Some(GIB),
            ..CgroupUsage::default()
        };
        let report = build_report(&inputs, &v1, &env, now()).expect("report");
        let json = serde_json::to_value(&report).expect("json");
        assert_eq!(json["cgroup"], "v1");
        let v2 = CgroupUsage {
            version: Some(CgroupVersion::V2),
            ..v1
        };
        let json = serde_json::to_value(build_report(&inputs, &v2, &env, now()).expect("report"))
            .expect("json");
        assert_eq!(json["cgroup"], "v2");
        let json = serde_json::to_value(
            build_report(&inputs, &CgroupUsage::default(), &env, now()).expect("report"),
        )
        .expect("json");
        assert!(json.get("cgroup").is_none(), "{json}");
    }

    #[test]
    fn cgroup_oom_kill_wins_over_the_exit_code_fallback() {
        let env = env_of(GITLAB_ENV);
        // The command was OOM-killed: the cgroup counted a kill.
        let killed = CgroupUsage {
            version: Some(CgroupVersion::V1),
            peak_memory_bytes: Some(64 << 20),
            memory_limit_bytes: Some(64 << 20),
            oom_kills: Some(1),
            cpu_usage_usec: None,
        };
        let inputs = ReportInputs {
            exit_code: Some("137".to_owned()),
            ..ReportInputs::default()
        };
        let report = build_report(&inputs, &killed, &env, now()).expect("report");
        assert!(report.oom_killed);
        // A plain SIGKILL at the limit, no kill counted: not an OOM kill.
        let not_killed = CgroupUsage {
            oom_kills: Some(0),
            ..killed
        };
        let report = build_report(&inputs, &not_killed, &env, now()).expect("report");
        assert!(!report.oom_killed);
    }

    #[test]
    fn gitlab_host_without_url() {
        let env = env_of(&[
            ("GITLAB_CI", "true"),
            ("CI_SERVER_HOST", "gl.example.org"),
            ("CI_JOB_ID", "1"),
        ]);
        let report = build_report(
            &ReportInputs::default(),
            &CgroupUsage::default(),
            env,
            now(),
        )
        .expect("report");
        assert_eq!(report.instance, "gl.example.org");
    }

    #[test]
    fn github_defaults_and_required_job_id() {
        let inputs = ReportInputs::default();
        let err = build_report(&inputs, &CgroupUsage::default(), env_of(GITHUB_ENV), now())
            .expect_err("github needs a job id");
        assert!(err.to_string().contains("RUNYARD_JOB_ID"), "{err}");

        let inputs = ReportInputs {
            job_id: Some("51725241954".to_owned()),
            ..ReportInputs::default()
        };
        let report = build_report(&inputs, &CgroupUsage::default(), env_of(GITHUB_ENV), now())
            .expect("report");
        assert_eq!(report.forge, Forge::Github);
        assert_eq!(report.instance, "github.com");
        assert_eq!(report.job_id, 51_725_241_954);
        assert_eq!(report.attempt, 2);
        assert_eq!(report.git_ref.as_deref(), Some("main"));
        assert_eq!(report.project.as_deref(), Some("acme/app"));
        assert_eq!(
            report.workload,
            BTreeMap::from([
                ("repo".to_owned(), "acme/app".to_owned()),
                ("workflow".to_owned(), "CI".to_owned()),
                ("job".to_owned(), "test".to_owned()),
            ])
        );
        // Nothing measured: nothing invented.
        let json = serde_json::to_value(&report).expect("json");
        for absent in [
            "peak_memory_bytes",
            "memory_request_bytes",
            "memory_limit_bytes",
            "cpu_seconds",
            "wall_seconds",
            "cpu_request_millicores",
            "exit_code",
            "cgroup",
        ] {
            assert!(json.get(absent).is_none(), "{absent} should be omitted");
        }
        assert_eq!(json["oom_killed"], false);
        assert_eq!(json["ref"], "main");
    }

    #[test]
    fn github_enterprise_instance() {
        let env = env_of(&[
            ("GITHUB_ACTIONS", "true"),
            ("GITHUB_SERVER_URL", "https://ghe.corp.example"),
        ]);
        let inputs = ReportInputs {
            job_id: Some("7".to_owned()),
            ..ReportInputs::default()
        };
        let report = build_report(&inputs, &CgroupUsage::default(), env, now()).expect("report");
        assert_eq!(report.instance, "ghe.corp.example");
    }

    #[test]
    fn explicit_inputs_win_over_environment() {
        let inputs = ReportInputs {
            forge: Some(Forge::Gitlab),
            instance: Some("https://other.example.com/".to_owned()),
            job_id: Some("99".to_owned()),
            attempt: Some(3),
            git_ref: Some("feature".to_owned()),
            project: Some("g/p".to_owned()),
            workload: vec![
                "package=zlib,version=1.3".to_owned(),
                "version=1.3.1".to_owned(),
            ],
            wall_seconds: Some(12.5),
            started_at: Some("2025-06-01T12:00:00Z".to_owned()),
            ..ReportInputs::default()
        };
        let report = build_report(&inputs, &CgroupUsage::default(), env_of(GITHUB_ENV), now())
            .expect("report");
        assert_eq!(report.forge, Forge::Gitlab);
        assert_eq!(report.instance, "other.example.com");
        assert_eq!(report.job_id, 99);
        assert_eq!(report.attempt, 3);
        assert_eq!(report.git_ref.as_deref(), Some("feature"));
        assert_eq!(report.project.as_deref(), Some("g/p"));
        assert_eq!(
            report.workload,
            BTreeMap::from([
                ("package".to_owned(), "zlib".to_owned()),
                ("version".to_owned(), "1.3.1".to_owned()),
            ])
        );
        assert_eq!(report.wall_seconds, Some(12.5));
    }

    #[test]
    fn limit_from_cgroup_wins_else_from_inputs() {
        let env = env_of(GITLAB_ENV);
        let inputs = ReportInputs {
            memory_limit: Some("4Gi".to_owned()),
            ..ReportInputs::default()
        };
        let limited = CgroupUsage {
            memory_limit_bytes: Some(2 * GIB),
            ..CgroupUsage::default()
        };
        let report = build_report(&inputs, &limited, &env, now()).expect("report");
        assert_eq!(report.memory_limit_bytes, Some(2 * GIB));
        let report = build_report(&inputs, &CgroupUsage::default(), &env, now()).expect("report");
        assert_eq!(report.memory_limit_bytes, Some(4 * GIB));
    }

    #[test]
    fn oom_fallback_through_build_report() {
        let env = env_of(GITLAB_ENV);
        let cgroup = CgroupUsage {
            version: None,
            peak_memory_bytes: Some(GIB / 100 * 97),
            memory_limit_bytes: Some(GIB),
            oom_kills: None,
            cpu_usage_usec: None,
        };
        let inputs = ReportInputs {
            exit_code: Some("137".to_owned()),
            ..ReportInputs::default()
        };
        assert!(
            build_report(&inputs, &cgroup, &env, now())
                .expect("report")
                .oom_killed
        );
        let cgroup = CgroupUsage {
            oom_kills: Some(0),
            ..cgroup
        };
        assert!(
            !build_report(&inputs, &cgroup, &env, now())
                .expect("report")
                .oom_killed
        );
        let inputs = ReportInputs {
            oom_killed: true,
            ..inputs
        };
        assert!(
            build_report(&inputs, &cgroup, &env, now())
                .expect("report")
                .oom_killed
        );
    }

    #[test]
    fn errors_name_the_field() {
        let env = env_of(GITLAB_ENV);
        let cases: [(ReportInputs, &str); 6] = [
            (
                ReportInputs {
                    memory_request: Some("lots".to_owned()),
                    ..ReportInputs::default()
                },
                "\"lots\"",
            ),
            (
                ReportInputs {
                    cpu_request: Some("2 cores".to_owned()),
                    ..ReportInputs::default()
                },
                "\"2 cores\"",
            ),
            (
                ReportInputs {
                    exit_code: Some("failed".to_owned()),
                    ..ReportInputs::default()
                },
                "exit_code",
            ),
            (
                ReportInputs {
                    job_id: Some("abc".to_owned()),
                    ..ReportInputs::default()
                },
                "job_id",
            ),
            (
                ReportInputs {
                    started_at: Some("yesterday".to_owned()),
                    ..ReportInputs::default()
                },
                "started_at",
            ),
            (
                ReportInputs {
                    workload: vec!["zlib".to_owned()],
                    ..ReportInputs::default()
                },
                "\"zlib\"",
            ),
        ];
        for (inputs, needle) in cases {
            let err =
                build_report(&inputs, &CgroupUsage::default(), &env, now()).expect_err(needle);
            assert!(err.to_string().contains(needle), "{needle}: {err}");
        }
    }

    #[test]
    fn unknown_forge_and_missing_gitlab_identity() {
        let err = build_report(
            &ReportInputs::default(),
            &CgroupUsage::default(),
            env_of(&[]),
            now(),
        )
        .expect_err("no forge");
        assert!(matches!(err, Error::UnknownForge));
        let err = build_report(
            &ReportInputs::default(),
            &CgroupUsage::default(),
            env_of(&[("GITLAB_CI", "true"), ("CI_JOB_ID", "")]),
            now(),
        )
        .expect_err("no instance");
        assert!(err.to_string().contains("instance"), "{err}");
    }
}
