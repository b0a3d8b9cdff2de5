//! The simulated forge and cloud: a FIFO job queue, runners that boot, take
//! any queued job once online (so jobs are stolen as on GitHub), run it and
//! finish (ephemeral: one job each), and an event queue in virtual time.
//! Every policy is run against its own copy, fed the same workload and the
//! same sequence of boot times.
//!
//! The simulated pool is the only one, so every runner may take every job,
//! as every runner of a webhook pool (the same labels) or of a runner scale
//! set may. What differs is which idle runner ([`Assign`]).

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::workload::{Boot, WorkJob};
use crate::core::world::Clock;

/// Where a runner is, as the forge and the cloud know it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    /// Created, not yet online.
    Booting,
    /// Online, waiting for a job.
    Idle,
    /// Running a job.
    Busy,
    /// Its job is done; the instance stays until it is deleted.
    Finished,
    /// The create failed: nothing exists (and nothing is paid).
    Failed,
    /// Deleted.
    Deleted,
}

/// One runner instance.
#[derive(Debug, Clone)]
pub(crate) struct Runner {
    /// Created (paid from here).
    pub created_at: Clock,
    /// How long it takes to come online.
    pub boot: Duration,
    /// Came online.
    pub online_at: Option<Clock>,
    /// Took its job.
    pub assigned_at: Option<Clock>,
    /// Its job completed.
    pub finished_at: Option<Clock>,
    /// Deleted (paid until here).
    pub deleted_at: Option<Clock>,
    /// State.
    pub state: State,
    /// The job it was made for, if any (garm labels it; runyard claims it).
    pub made_for: Option<usize>,
    /// Its memory (its flavor's), bytes.
    pub memory: u64,
    /// The job it ran.
    pub job: Option<usize>,
}

/// One job at the forge.
#[derive(Debug, Clone)]
pub(crate) struct Job {
    /// From the workload.
    pub work: WorkJob,
    /// Taken by a runner.
    pub started_at: Option<Clock>,
    /// Done.
    pub completed_at: Option<Clock>,
    /// The runner that ran it.
    pub runner: Option<usize>,
    /// Times it was started (conservation: exactly once).
    pub starts: u32,
}

/// What happens at an instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    Arrive(usize),
    Rediscover(usize),
    Online(usize),
    Complete(usize),
}

/// What a scaler could learn (whether it does is the driver's business).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Obs {
    /// A job was queued (the `queued` webhook).
    Queued(usize),
    /// A lost job found by the reconciler, still queued.
    Rediscovered(usize),
    /// A runner came online.
    Online(usize),
    /// A job started on a runner (the `in_progress` webhook).
    Started {
        /// Job.
        job: usize,
        /// Runner.
        runner: usize,
    },
    /// A job completed (the `completed` webhook).
    Completed {
        /// Job.
        job: usize,
        /// Runner.
        runner: usize,
    },
}

/// Which idle runner takes the oldest queued job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Assign {
    /// The runner idle longest: GitHub with webhooks, as this simulation has
    /// always assumed (GitHub does not say).
    LongestIdle,
    /// Any idle runner of the set: the Actions service giving a job
    /// assigned to a runner scale set to one of the set's idle runners. It
    /// does not say which either, so a uniformly random one, drawn from a
    /// stream of its own (boot times stay those of every other policy).
    AnyIdle,
}

/// Mixed into the forge's seed for the [`Assign::AnyIdle`] draws.
const ASSIGN_STREAM: u64 = 0x6173_7369_676e;

/// A delete the forge refused: the runner is running a job (GitHub's 422).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Busy;

/// The forge, the cloud and the clock's event queue.
#[derive(Debug)]
pub(crate) struct Forge {
    /// Jobs, by workload index.
    pub jobs: Vec<Job>,
    /// Runners, by creation order.
    pub runners: Vec<Runner>,
    heap: BinaryHeap<Reverse<(Clock, u64, Ev)>>,
    seq: u64,
    /// Queued jobs, oldest first.
    queue: BTreeSet<(Clock, usize)>,
    /// Idle runners, longest idle first.
    idle: BTreeSet<(Clock, usize)>,
    /// Booting runners.
    booting: BTreeSet<usize>,
    busy: usize,
    finished: usize,
    completed: usize,
    all_done_at: Option<Clock>,
    peak: usize,
    boot: Boot,
    rng: StdRng,
    create_failures: f64,
    assign: Assign,
    assign_rng: StdRng,
    obs: Vec<Obs>,
}

impl Forge {
    /// A forge that will see `work` arrive. `seed` drives boot times and
    /// create failures; lost jobs are found again at the next multiple of
    /// `reconcile` (never when it is zero); `assign` picks the idle runner
    /// that takes a job.
    pub(crate) fn new(
        work: &[WorkJob],
        boot: Boot,
        seed: u64,
        create_failures: f64,
        reconcile: Duration,
        assign: Assign,
    ) -> Self {
        let mut forge = Self {
            jobs: Vec::with_capacity(work.len()),
            runners: Vec::new(),
            heap: BinaryHeap::new(),
            seq: 0,
            queue: BTreeSet::new(),
            idle: BTreeSet::new(),
            booting: BTreeSet::new(),
            busy: 0,
            finished: 0,
            completed: 0,
            all_done_at: None,
            peak: 0,
            boot,
            rng: StdRng::seed_from_u64(seed),
            create_failures,
            assign,
            assign_rng: StdRng::seed_from_u64(seed ^ ASSIGN_STREAM),
            obs: Vec::new(),
        };
        for (i, w) in work.iter().enumerate() {
            forge.jobs.push(Job {
                work: *w,
                started_at: None,
                completed_at: None,
                runner: None,
                starts: 0,
            });
            forge.at(w.queued_at, Ev::Arrive(i));
            if w.lost && !reconcile.is_zero() {
                let period = reconcile.as_millis().max(1);
                let next = (w.queued_at.as_millis() / period + 1) * period;
                let at = Duration::from_millis(u64::try_from(next).unwrap_or(u64::MAX));
                forge.at(at, Ev::Rediscover(i));
            }
        }
        forge
    }

    fn at(&mut self, t: Clock, ev: Ev) {
        self.seq += 1;
        self.heap.push(Reverse((t, self.seq, ev)));
    }

    /// When the next thing happens, if anything is scheduled.
    pub(crate) fn next_time(&self) -> Option<Clock> {
        self.heap.peek().map(|Reverse((t, _, _))| *t)
    }

    /// Every job has completed and no runner is left.
    pub(crate) fn quiescent(&self) -> bool {
        self.completed == self.jobs.len() && self.alive() == 0
    }

    /// When the last job completed.
    pub(crate) fn all_done_at(&self) -> Option<Clock> {
        self.all_done_at
    }

    /// Runners that exist (booting, idle, busy, or finished and not yet
    /// deleted): what a provider bills and `max_runners` counts.
    pub(crate) fn alive(&self) -> usize {
        self.booting.len() + self.idle.len() + self.busy + self.finished
    }

    /// Runners that could still run a job (booting, idle, busy).
    pub(crate) fn working(&self) -> usize {
        self.booting.len() + self.idle.len() + self.busy
    }

    /// Jobs waiting for a runner.
    pub(crate) fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Jobs running.
    pub(crate) fn running(&self) -> usize {
        self.busy
    }

    /// Idle runners, longest idle first.
    pub(crate) fn idle_runners(&self) -> impl Iterator<Item = usize> + '_ {
        self.idle.iter().map(|(_, r)| *r)
    }

    /// Booting runners, oldest first.
    pub(crate) fn booting_runners(&self) -> impl Iterator<Item = usize> + '_ {
        self.booting.iter().copied()
    }

    /// Most runners alive at once.
    pub(crate) fn peak(&self) -> usize {
        self.peak
    }

    /// Creates a runner of `memory` bytes at `now`; `false` when the create
    /// failed (nothing is made, nothing paid).
    pub(crate) fn create(
        &mut self,
        now: Clock,
        made_for: Option<usize>,
        memory: u64,
    ) -> (usize, bool) {
        let boot = self.boot.sample(&mut self.rng);
        let fails = self.rng.random::<f64>() < self.create_failures;
        let id = self.runners.len();
        self.runners.push(Runner {
            created_at: now,
            boot,
            online_at: None,
            assigned_at: None,
            finished_at: None,
            deleted_at: fails.then_some(now),
            state: if fails { State::Failed } else { State::Booting },
            made_for,
            memory,
            job: None,
        });
        if !fails {
            self.booting.insert(id);
            self.at(now + boot, Ev::Online(id));
            self.peak = self.peak.max(self.alive());
        }
        (id, !fails)
    }

    /// Deletes a runner (deregisters it and removes its instance); refused
    /// while it runs a job.
    pub(crate) fn delete(&mut self, now: Clock, id: usize) -> Result<(), Busy> {
        let Some(r) = self.runners.get_mut(id) else {
            return Ok(());
        };
        match r.state {
            State::Busy => return Err(Busy),
            State::Deleted | State::Failed => return Ok(()),
            State::Booting => {
                self.booting.remove(&id);
            }
            State::Idle => {
                let since = r.online_at.unwrap_or(now);
                self.idle.remove(&(since, id));
            }
            State::Finished => self.finished -= 1,
        }
        r.state = State::Deleted;
        r.deleted_at = Some(now);
        Ok(())
    }

    /// The idle runner that takes the next job, if any is idle.
    fn pick_idle(&mut self) -> Option<(Clock, usize)> {
        match self.assign {
            Assign::LongestIdle => self.idle.first().copied(),
            Assign::AnyIdle => {
                let n = self.idle.len();
                if n == 0 {
                    return None;
                }
                let k = self.assign_rng.random_range(0..n);
                self.idle.iter().nth(k).copied()
            }
        }
    }

    /// Processes everything scheduled up to `now`, then hands queued jobs to
    /// idle runners, oldest job first. Returns what a scaler could observe.
    pub(crate) fn step(&mut self, now: Clock) -> Vec<Obs> {
        while let Some(Reverse((t, _, ev))) = self.heap.peek().copied() {
            if t > now {
                break;
            }
            self.heap.pop();
            match ev {
                Ev::Arrive(j) => {
                    self.queue.insert((self.jobs[j].work.queued_at, j));
                    self.obs.push(Obs::Queued(j));
                }
                Ev::Rediscover(j) => {
                    if self.jobs[j].started_at.is_none() {
                        self.obs.push(Obs::Rediscovered(j));
                    }
                }
                Ev::Online(r) => {
                    let runner = &mut self.runners[r];
                    if runner.state == State::Booting {
                        runner.state = State::Idle;
                        runner.online_at = Some(t);
                        self.booting.remove(&r);
                        self.idle.insert((t, r));
                        self.obs.push(Obs::Online(r));
                    }
                }
                Ev::Complete(j) => {
                    let job = &mut self.jobs[j];
                    job.completed_at = Some(t);
                    self.completed += 1;
                    if let Some(r) = job.runner {
                        let runner = &mut self.runners[r];
                        runner.state = State::Finished;
                        runner.finished_at = Some(t);
                        self.busy -= 1;
                        self.finished += 1;
                        self.obs.push(Obs::Completed { job: j, runner: r });
                    }
                    if self.completed == self.jobs.len() {
                        self.all_done_at = Some(t);
                    }
                }
            }
        }
        while let Some(&(queued_at, j)) = self.queue.first() {
            let Some((since, r)) = self.pick_idle() else {
                break;
            };
            self.queue.remove(&(queued_at, j));
            self.idle.remove(&(since, r));
            let job = &mut self.jobs[j];
            job.started_at = Some(now);
            job.runner = Some(r);
            job.starts += 1;
            let done = now + job.work.duration;
            let runner = &mut self.runners[r];
            runner.state = State::Busy;
            runner.assigned_at = Some(now);
            runner.job = Some(j);
            self.busy += 1;
            self.at(done, Ev::Complete(j));
            self.obs.push(Obs::Started { job: j, runner: r });
        }
        std::mem::take(&mut self.obs)
    }
}
