//! Finding what someone names: a job by its id (`4711`, or
//! `gitlab:gitlab.example.com:4711`), a runner by its name, jobs of a
//! repository or project, workloads by package, repository or project.

use crate::pools::{self, RunnerLine};
use crate::workload::{self, WorkloadHit};
use crate::{InsightError, JOB_COLUMNS, JobBrief};

/// Most hits of each kind.
pub const MAX_HITS: i64 = 50;

/// What a search found.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Found {
    /// Jobs: by id, or of the project named.
    pub jobs: Vec<JobBrief>,
    /// The runner named.
    pub runner: Option<RunnerLine>,
    /// Workloads of the package, repository or project named.
    pub workloads: Vec<WorkloadHit>,
}

impl Found {
    /// Nothing matched.
    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty() && self.runner.is_none() && self.workloads.is_empty()
    }
}

/// How a search term reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Term {
    /// A job id, on any forge.
    JobId(i64),
    /// `forge:instance:id`.
    Job(crate::story::JobRef),
    /// Anything else: a runner name, a project, a package.
    Name(String),
}

impl Term {
    /// Reads `q` (trimmed); `None` when it is empty or too long to name
    /// anything (over 512 bytes).
    pub fn parse(q: &str) -> Option<Self> {
        let q = q.trim();
        if q.is_empty() || q.len() > 512 {
            return None;
        }
        if let Ok(id) = q.parse::<i64>() {
            return Some(Self::JobId(id));
        }
        if let [forge @ ("github" | "gitlab"), instance, id] =
            q.split(':').collect::<Vec<_>>().as_slice()
            && !instance.is_empty()
            && let Ok(job_id) = id.parse::<i64>()
        {
            return Some(Self::Job(crate::story::JobRef {
                forge: (*forge).to_owned(),
                instance: (*instance).to_owned(),
                job_id,
            }));
        }
        Some(Self::Name(q.to_owned()))
    }
}

/// Everything `term` names.
pub async fn search(db: &sqlx::PgPool, term: &Term) -> Result<Found, InsightError> {
    let mut found = Found::default();
    match term {
        Term::JobId(id) => {
            found.jobs = crate::job_rows(
                sqlx::query(&format!(
                    "SELECT {JOB_COLUMNS} FROM jobs j WHERE j.job_id = $1 ORDER BY j.forge, j.instance LIMIT $2"
                ))
                .bind(id)
                .bind(MAX_HITS)
                .fetch_all(db)
                .await,
            )?;
        }
        Term::Job(job) => {
            found.jobs = crate::job_rows(
                sqlx::query(&format!(
                    "SELECT {JOB_COLUMNS} FROM jobs j
                      WHERE j.forge = $1 AND j.instance = $2 AND j.job_id = $3"
                ))
                .bind(&job.forge)
                .bind(&job.instance)
                .bind(job.job_id)
                .fetch_all(db)
                .await,
            )?;
        }
        Term::Name(name) => {
            found.runner = pools::runner(db, name).await?;
            found.jobs = crate::job_rows(
                sqlx::query(&format!(
                    "SELECT {JOB_COLUMNS} FROM jobs j WHERE j.project = $1
                      ORDER BY j.first_seen_at DESC LIMIT $2"
                ))
                .bind(name)
                .bind(MAX_HITS)
                .fetch_all(db)
                .await,
            )?;
            found.workloads = workload::find(db, name, MAX_HITS).await?;
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terms_read_as_ids_job_keys_or_names() {
        assert_eq!(Term::parse(" 4711 "), Some(Term::JobId(4711)));
        assert_eq!(
            Term::parse("gitlab:gitlab.example.com:4711"),
            Some(Term::Job(crate::story::JobRef {
                forge: "gitlab".into(),
                instance: "gitlab.example.com".into(),
                job_id: 4711
            }))
        );
        assert_eq!(
            Term::parse("gitlab::4711"),
            Some(Term::Name("gitlab::4711".into()))
        );
        assert_eq!(
            Term::parse("spack/spack"),
            Some(Term::Name("spack/spack".into()))
        );
        assert_eq!(Term::parse("  "), None);
        assert_eq!(Term::parse(&"x".repeat(513)), None);
    }
}
