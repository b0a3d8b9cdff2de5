//! Runner scale sets (`mode = "scale-set"` pools): the scaler holds the
//! scale set's message session on the Actions service and long-polls it for
//! the jobs assigned to the set, so no webhook has to reach it.
//!
//! - [`ScaleSet`]: one pool's scale set: made sure of at start (created with
//!   the pool's runner group and labels, a label change it cannot apply
//!   refused by name), and the forge side of its runners (JIT configs from
//!   the scale set, the runner list, removal refused while busy).
//! - [`convert`]: a message's job messages as `JobObserved` events.
//! - [`listener`]: the session, held by the replica holding the pool's
//!   lease, and the long poll.

pub mod convert;
pub mod listener;
pub mod resolve;

use std::sync::{Mutex, RwLock};

use runyard_forge::api::ApiError;
use runyard_forge::api::scaleset::{
    ActionsClient, Exception, NewScaleSet, RemoveRunner, ScaleSetPatch, Statistics, exception,
};
use serde::Serialize;

use crate::forges::{ForgeError, ForgeRunner, Registration, Unregistered, is_instance_of};

/// The runner group id of a GitHub owner's default group.
pub const DEFAULT_RUNNER_GROUP_ID: i64 = 1;

/// The work folder JIT runners are configured with.
const WORK_FOLDER: &str = "_work";

/// Why a scale set cannot be used as configured.
#[derive(Debug, thiserror::Error)]
pub enum EnsureError {
    /// The scale set exists with other labels; the service applies labels
    /// only when a scale set is created.
    #[error(
        "scale set {name:?} exists with labels {have:?} but pool {pool:?} asks for {want:?}: the Actions service applies labels only when a scale set is created; delete the scale set (it is made again at the next start) or give the pool another scale_set_name"
    )]
    Labels {
        /// The pool.
        pool: String,
        /// The scale set.
        name: String,
        /// Its labels on the service.
        have: Vec<String>,
        /// The pool's.
        want: Vec<String>,
    },
    /// The configured runner group does not exist.
    #[error("pool {pool:?}: no runner group named {group:?} on the Actions service")]
    NoRunnerGroup {
        /// The pool.
        pool: String,
        /// The group's name.
        group: String,
    },
    /// The service could not be asked.
    #[error("pool {pool:?}: the Actions service: {source}")]
    Api {
        /// The pool.
        pool: String,
        /// What failed.
        #[source]
        source: ApiError,
    },
}

impl EnsureError {
    /// A configuration the service refuses for good (as opposed to a
    /// service that could not be reached).
    pub fn is_permanent(&self) -> bool {
        matches!(self, Self::Labels { .. } | Self::NoRunnerGroup { .. })
    }
}

/// What `/v1/pools` shows of a scale set's session.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SessionView {
    /// The scale set's name.
    pub name: String,
    /// Its id, once known.
    pub id: Option<i64>,
    /// `active` (this replica holds the session), `standby` (another
    /// replica holds the pool's lease), `connecting` or `error`.
    pub state: &'static str,
    /// The session id, while held.
    pub session_id: Option<String>,
    /// The last message whose events are in the log.
    pub last_message_id: i64,
    /// When the service last answered a poll (RFC 3339).
    pub last_message_at: Option<String>,
    /// The service's statistics with its latest answer.
    pub statistics: Option<Statistics>,
    /// The last failure, when the state is `error`.
    pub error: Option<String>,
    /// Sessions made again since start (silent polls, expiry, takeovers).
    pub sessions_recreated: u64,
    /// The service's assigned jobs less the scaler's own count of the
    /// pool's queued and running jobs (a check on the log, never the
    /// source: positive means jobs the scaler has not heard of).
    pub unseen_jobs: i64,
    /// Since when (Unix seconds) `unseen_jobs` has stayed positive.
    #[serde(skip)]
    pub unseen_since: Option<i64>,
}

/// How long the service may count more assigned jobs than the scaler
/// before it says so (messages and the statistics they carry cross).
const UNSEEN_GRACE_S: i64 = 120;

/// One pool's runner scale set.
#[derive(Debug)]
pub struct ScaleSet {
    /// The pool.
    pub pool: String,
    /// The scale set's name.
    pub name: String,
    /// Its labels: the name first, then the pool's.
    pub labels: Vec<String>,
    /// The runner group by name (`None`: the default group).
    pub runner_group: Option<String>,
    /// The Actions service client (admin connection from the pool's GitHub
    /// credentials).
    pub client: ActionsClient,
    id: RwLock<Option<i64>>,
    /// What `/v1/pools` shows.
    pub view: Mutex<SessionView>,
}

impl ScaleSet {
    /// A scale set for `pool`, not yet made sure of.
    pub fn new(
        pool: &str,
        name: &str,
        labels: Vec<String>,
        runner_group: Option<String>,
        client: ActionsClient,
    ) -> Self {
        Self {
            pool: pool.to_owned(),
            name: name.to_owned(),
            labels,
            runner_group,
            client,
            id: RwLock::new(None),
            view: Mutex::new(SessionView {
                name: name.to_owned(),
                state: "connecting",
                ..SessionView::default()
            }),
        }
    }

    /// The scale set's id, once [`ScaleSet::ensure`] found or made it.
    pub fn id(&self) -> Option<i64> {
        *self
            .id
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Forgets the id (the service deleted the scale set): the next
    /// [`ScaleSet::ensure`] makes it again.
    pub fn forget(&self) {
        *self
            .id
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
    }

    /// Changes what `/v1/pools` shows.
    pub fn update_view(&self, f: impl FnOnce(&mut SessionView)) {
        let mut view = self
            .view
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(&mut view);
    }

    /// Compares the service's assigned jobs with the scaler's own count
    /// (`seen`: the pool's queued and running jobs) at `now` (Unix
    /// seconds); returns the gap, and warns once when the service has
    /// counted more for longer than two minutes.
    pub fn check_count(&self, seen: u32, now: i64) -> i64 {
        let mut view = self
            .view
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let Some(stats) = view.statistics else {
            return 0;
        };
        let gap = stats.total_assigned_jobs - i64::from(seen);
        view.unseen_jobs = gap;
        if gap <= 0 {
            view.unseen_since = None;
            return gap;
        }
        let since = *view.unseen_since.get_or_insert(now);
        if now - since >= UNSEEN_GRACE_S {
            tracing::warn!(pool = %self.pool, scale_set = %self.name, assigned = stats.total_assigned_jobs, seen, "the Actions service counts assigned jobs the scaler has no message for; they get a runner once the service assigns them again");
            // Once per spell.
            view.unseen_since = Some(i64::MAX / 2);
        }
        gap
    }

    /// A copy of what `/v1/pools` shows.
    pub fn view(&self) -> SessionView {
        self.view
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn api(&self, source: ApiError) -> EnsureError {
        EnsureError::Api {
            pool: self.pool.clone(),
            source,
        }
    }

    /// Finds the scale set by name in its runner group, or creates it with
    /// the pool's labels; returns its id. A scale set that exists with
    /// other labels is refused ([`EnsureError::Labels`]): the service
    /// ignores labels on update.
    pub async fn ensure(&self) -> Result<i64, EnsureError> {
        let group_id = match self.runner_group.as_deref() {
            None => DEFAULT_RUNNER_GROUP_ID,
            Some(g) if g.eq_ignore_ascii_case("default") => DEFAULT_RUNNER_GROUP_ID,
            Some(g) => {
                self.client
                    .runner_group_by_name(g)
                    .await
                    .map_err(|e| self.api(e))?
                    .ok_or_else(|| EnsureError::NoRunnerGroup {
                        pool: self.pool.clone(),
                        group: g.to_owned(),
                    })?
                    .id
            }
        };
        let found = self
            .client
            .scale_set_by_name(group_id, &self.name)
            .await
            .map_err(|e| self.api(e))?;
        let set = match found {
            Some(set) => {
                if !same_labels(&set.labels, &self.labels) {
                    return Err(EnsureError::Labels {
                        pool: self.pool.clone(),
                        name: self.name.clone(),
                        have: set.labels,
                        want: self.labels.clone(),
                    });
                }
                if set.runner_group_id != group_id {
                    let patch = ScaleSetPatch {
                        name: None,
                        runner_group_id: Some(group_id),
                    };
                    self.client
                        .update_scale_set(set.id, &patch)
                        .await
                        .map_err(|e| self.api(e))?
                } else {
                    set
                }
            }
            None => {
                let new = NewScaleSet {
                    name: self.name.clone(),
                    runner_group_id: group_id,
                    labels: self.labels.clone(),
                    disable_update: false,
                };
                match self.client.create_scale_set(&new).await {
                    Ok(made) => {
                        tracing::info!(pool = %self.pool, scale_set = %self.name, id = made.id, "runner scale set created");
                        made
                    }
                    Err(e) => {
                        // Another replica made it first: use that one.
                        let again = self
                            .client
                            .scale_set_by_name(group_id, &self.name)
                            .await
                            .map_err(|e| self.api(e))?;
                        match again {
                            Some(set) if same_labels(&set.labels, &self.labels) => set,
                            Some(set) => {
                                return Err(EnsureError::Labels {
                                    pool: self.pool.clone(),
                                    name: self.name.clone(),
                                    have: set.labels,
                                    want: self.labels.clone(),
                                });
                            }
                            None => return Err(self.api(e)),
                        }
                    }
                }
            }
        };
        *self
            .id
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(set.id);
        self.update_view(|v| v.id = Some(set.id));
        Ok(set.id)
    }

    /// The id, making sure of the scale set first when it is not known yet.
    async fn ready_id(&self) -> Result<i64, ForgeError> {
        if let Some(id) = self.id() {
            return Ok(id);
        }
        self.ensure().await.map_err(|e| match e {
            EnsureError::Api { source, .. } => ForgeError::Api(source),
            other => ForgeError::ScaleSet(other.to_string()),
        })
    }

    /// A JIT runner of the scale set named `name`. A runner of that name
    /// left by an earlier attempt is removed first when it is the scale
    /// set's own (JIT names are unique).
    pub async fn register(&self, name: &str) -> Result<Registration, ForgeError> {
        let id = self.ready_id().await?;
        let jit = match self.client.generate_jit_config(id, name, WORK_FOLDER).await {
            Err(e) if exception(&e) == Some(Exception::RunnerExists) => {
                let old = self.client.runner_by_name(name).await?;
                match old {
                    Some(old) if old.runner_scale_set_id == id => {
                        self.client.remove_runner(old.id).await?;
                    }
                    Some(_) => {
                        return Err(ForgeError::ScaleSet(format!(
                            "a runner named {name:?} exists outside scale set {:?}",
                            self.name
                        )));
                    }
                    None => {}
                }
                self.client
                    .generate_jit_config(id, name, WORK_FOLDER)
                    .await?
            }
            other => other?,
        };
        Ok(Registration {
            jit_config: jit.encoded_jit_config,
            runner_id: u64::try_from(jit.runner.id).unwrap_or_default(),
        })
    }

    /// Removes a runner; `Busy` while it runs a job (the service refuses).
    pub async fn unregister(&self, runner_id: u64) -> Result<Unregistered, ForgeError> {
        let id = i64::try_from(runner_id).unwrap_or(i64::MAX);
        Ok(match self.client.remove_runner(id).await? {
            RemoveRunner::Busy => Unregistered::Busy(Vec::new()),
            RemoveRunner::Removed | RemoveRunner::NotFound => Unregistered::Gone,
        })
    }

    /// One runner; `None` when the service no longer has it.
    pub async fn runner(&self, runner_id: u64) -> Result<Option<ForgeRunner>, ForgeError> {
        let id = i64::try_from(runner_id).unwrap_or(i64::MAX);
        Ok(self.client.runner(id).await?.map(forge_runner))
    }

    /// The scale set's runners that are this pool's instances.
    pub async fn list(&self) -> Result<Vec<ForgeRunner>, ForgeError> {
        let id = self.ready_id().await?;
        Ok(self
            .client
            .list_runners()
            .await?
            .into_iter()
            .filter(|r| r.runner_scale_set_id == id && is_instance_of(&r.name, &self.pool))
            .map(forge_runner)
            .collect())
    }
}

fn forge_runner(r: runyard_forge::api::scaleset::RunnerReference) -> ForgeRunner {
    ForgeRunner {
        id: u64::try_from(r.id).unwrap_or_default(),
        online: r.status.as_deref() == Some("online"),
        busy: r.busy.unwrap_or(false),
        name: r.name,
        paused: false,
        running_jobs: Vec::new(),
    }
}

/// The same labels, compared case-insensitively and without order.
fn same_labels(have: &[String], want: &[String]) -> bool {
    let norm = |l: &[String]| {
        let mut v: Vec<String> = l.iter().map(|x| x.to_ascii_lowercase()).collect();
        v.sort();
        v.dedup();
        v
    };
    norm(have) == norm(want)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_services_count_checks_the_scalers_and_warns_after_a_grace() {
        let client = runyard_forge::api::scaleset::ActionsClient::new(
            runyard_forge::api::github::GitHubClient::new(
                "http://127.0.0.1:1",
                runyard_forge::api::github::GitHubAuth::Token("t".to_owned().into()),
                std::time::Duration::from_secs(1),
            )
            .expect("client"),
            runyard_forge::api::github::GitHubScope::Org("acme".into()),
            "https://github.com/acme",
            "http://127.0.0.1:1",
            &runyard_forge::api::ClientOptions::new(std::time::Duration::from_secs(1)),
        )
        .expect("client");
        let set = ScaleSet::new("big", "big", vec!["big".into()], None, client);
        assert_eq!(
            set.check_count(3, 0),
            0,
            "no statistics yet: nothing to check"
        );
        set.update_view(|v| {
            v.statistics = Some(Statistics {
                total_assigned_jobs: 5,
                ..Statistics::default()
            });
        });
        assert_eq!(set.check_count(3, 100), 2);
        assert_eq!(set.view().unseen_since, Some(100));
        // Past the grace it has warned, once per spell.
        assert_eq!(set.check_count(3, 100 + UNSEEN_GRACE_S), 2);
        assert!(set.view().unseen_since > Some(100 + UNSEEN_GRACE_S));
        assert_eq!(set.check_count(5, 400), 0);
        assert_eq!(
            set.view().unseen_since,
            None,
            "caught up: a new spell starts over"
        );
    }

    #[test]
    fn labels_compare_without_case_or_order() {
        let s = |v: &[&str]| v.iter().map(|x| (*x).to_owned()).collect::<Vec<_>>();
        assert!(same_labels(&s(&["Big", "linux"]), &s(&["linux", "big"])));
        assert!(!same_labels(&s(&["big"]), &s(&["big", "linux"])));
    }
}
