//! A pool's listings against the log's view, without IO: what a provider
//! listing and a forge listing show that the world does not (or the other
//! way round) becomes [`Finding`]s, each acted on by the engine off its
//! loop. A mismatch counts only at the second listing in a row showing it
//! ([`Sightings`]), so a create or delete whose event is still on its way
//! is never mistaken for one. The facts the forge listing settles without
//! any call (a runner's forge id, a busy runner's phase) are folded into
//! the world here.

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::core::world::{Phase, Runner, World};
use crate::forges::ForgeRunner;
use crate::provider::Instance;

/// Something a pool's listings show that needs an operation. Each names the
/// operation it is carried out under ([`Finding::op`]).
#[derive(Debug, Clone)]
pub enum Finding {
    /// A create another replica (or an earlier life of this one) began and
    /// never finished: adopted when both the instance and the forge runner
    /// exist, else what there is removed and the attempt failed.
    Interrupted {
        /// The runner the log has in `requested`.
        runner: Runner,
        /// Its instance, when the provider lists one.
        instance: Option<Instance>,
        /// Its forge runner's id, when the forge lists one.
        forge_id: Option<u64>,
    },
    /// A live runner the provider no longer lists.
    Gone {
        /// The runner.
        runner: Runner,
    },
    /// A live runner whose instance is listed stopped or in error.
    Stopped {
        /// The runner.
        runner: Runner,
        /// Its instance as listed.
        instance: Instance,
        /// Start it again (the pool says so, and it was not started once
        /// already) rather than replace it.
        start: bool,
    },
    /// A booting runner the forge lists online.
    Online {
        /// The runner's name.
        name: String,
    },
    /// What no runner of the log owns: an instance, a forge registration
    /// that is not busy, or both under one name.
    Orphan {
        /// The name.
        name: String,
        /// The instance's provider id, when listed.
        provider_id: Option<String>,
        /// The forge runner's id, when listed.
        forge_id: Option<u64>,
    },
    /// A registration under a live runner's name that is not its own (a
    /// register whose answer was lost, retried).
    Stale {
        /// The runner's name.
        name: String,
        /// The other registration's forge id.
        id: u64,
    },
}

impl Finding {
    /// The name of the operation that carries it out (at most one at a time
    /// per name).
    pub fn op(&self) -> String {
        match self {
            Self::Interrupted { runner, .. }
            | Self::Gone { runner }
            | Self::Stopped { runner, .. } => runner.name.clone(),
            Self::Online { name } => name.clone(),
            Self::Orphan { name, .. } => format!("orphan:{name}"),
            Self::Stale { name, id } => format!("stale:{name}#{id}"),
        }
    }
}

/// Mismatches seen per listing scope (a pool id), acted on at the second
/// listing in a row showing them.
#[derive(Debug, Default)]
pub struct Sightings {
    counts: HashMap<String, u32>,
}

impl Sightings {
    /// Counts a sighting of `kind`/`name` in this listing of `scope`; true
    /// at the second listing in a row showing it.
    pub fn sighted(
        &mut self,
        scope: &str,
        kind: &str,
        name: &str,
        seen_now: &mut HashSet<String>,
    ) -> bool {
        let key = format!("{scope}/{kind}/{name}");
        seen_now.insert(key.clone());
        let count = self.counts.entry(key.clone()).or_default();
        *count += 1;
        if *count < 2 {
            return false;
        }
        self.counts.remove(&key);
        true
    }

    /// Forgets what this listing of `scope` no longer shows.
    pub fn settle(&mut self, scope: &str, seen_now: &HashSet<String>) {
        let prefix = format!("{scope}/");
        self.counts
            .retain(|k, _| !k.starts_with(&prefix) || seen_now.contains(k));
    }
}

/// One pool's listing, and what the diff needs to know about the pool.
#[derive(Debug, Clone, Copy)]
pub struct Listing<'a> {
    /// The pool's name.
    pub pool: &'a str,
    /// Its id (the sightings' scope).
    pub scope: &'a str,
    /// A stopped instance is started again once (`stopped = "start"`).
    pub restart_stopped: bool,
    /// The provider's instances (`None`: the listing failed).
    pub instances: Option<&'a [Instance]>,
    /// The forge's runners (`None`: the listing failed).
    pub forge: Option<&'a [ForgeRunner]>,
}

/// The findings of one pool's listing, in the order they are acted on.
/// `busy` says an operation of that name is under way (its subject is
/// left alone); `restarted` holds the runners whose stopped instance was
/// started once.
pub fn diff(
    world: &mut World,
    listing: &Listing<'_>,
    busy: &dyn Fn(&str) -> bool,
    sightings: &mut Sightings,
    restarted: &mut HashSet<String>,
) -> Vec<Finding> {
    let Listing {
        pool,
        scope,
        restart_stopped,
        instances,
        forge,
    } = *listing;
    let mut seen_now = HashSet::new();
    let mut found = Vec::new();
    // Names a finding of this listing takes (as `busy` does afterwards).
    let mut taken: HashSet<String> = HashSet::new();
    let is_busy = |taken: &HashSet<String>, name: &str| busy(name) || taken.contains(name);
    let alive = |r: &Runner| matches!(r.phase, Phase::Created | Phase::Online | Phase::Assigned);
    // What nothing owns, by name: its provider id and forge id.
    let mut orphans: BTreeMap<String, (Option<String>, Option<u64>)> = BTreeMap::new();
    if let Some(instances) = instances {
        for i in instances {
            let known = world
                .runners
                .get(&i.name)
                .is_some_and(|r| r.phase != Phase::Deleted);
            if !known && !busy(&i.name) {
                orphans.entry(i.name.clone()).or_default().0 = Some(i.provider_id.clone());
            }
        }
        let listed: HashSet<&str> = instances.iter().map(|i| i.name.as_str()).collect();
        let mut missing: Vec<Runner> = Vec::new();
        let mut interrupted: Vec<Runner> = Vec::new();
        for r in world
            .runners
            .values()
            .filter(|r| r.pool == pool && !busy(&r.name))
        {
            if alive(r) && !listed.contains(r.name.as_str()) {
                missing.push(r.clone());
            } else if r.phase == Phase::Requested {
                interrupted.push(r.clone());
            }
        }
        let troubled: Vec<(Runner, Instance)> = instances
            .iter()
            .filter(|i| matches!(i.status.as_str(), "stopped" | "error"))
            .filter_map(|i| {
                let r = world.runners.get(&i.name)?;
                (r.pool == pool && alive(r) && !busy(&r.name)).then(|| (r.clone(), i.clone()))
            })
            .collect();
        for r in interrupted {
            if !sightings.sighted(scope, "interrupted", &r.name, &mut seen_now) {
                continue;
            }
            let instance = instances.iter().find(|i| i.name == r.name).cloned();
            let forge_id = forge
                .and_then(|f| f.iter().find(|f| f.name == r.name))
                .map(|f| f.id);
            taken.insert(r.name.clone());
            found.push(Finding::Interrupted {
                runner: r,
                instance,
                forge_id,
            });
        }
        for r in missing {
            if !sightings.sighted(scope, "gone", &r.name, &mut seen_now) {
                continue;
            }
            taken.insert(r.name.clone());
            found.push(Finding::Gone { runner: r });
        }
        for (r, i) in troubled {
            if !sightings.sighted(scope, "stopped", &r.name, &mut seen_now) {
                continue;
            }
            // Started again once: stopped a second time, it is replaced
            // (and its replacement may be started again once).
            let start = i.status == "stopped" && restart_stopped && !restarted.remove(&r.name);
            if start {
                restarted.insert(r.name.clone());
            }
            taken.insert(r.name.clone());
            found.push(Finding::Stopped {
                runner: r,
                instance: i,
                start,
            });
        }
    }
    let mut stale: Vec<(String, u64)> = Vec::new();
    for f in forge.unwrap_or_default() {
        match world.runners.get_mut(&f.name) {
            Some(r) if r.phase != Phase::Deleted => {
                if r.forge_runner_id.is_none() {
                    r.forge_runner_id = Some(f.id);
                } else if r.forge_runner_id != Some(f.id) {
                    if !is_busy(&taken, &f.name) {
                        stale.push((f.name.clone(), f.id));
                    }
                    continue;
                }
                if f.busy && r.phase < Phase::Assigned && r.phase != Phase::Failed {
                    r.phase = Phase::Assigned;
                } else if f.online
                    && matches!(r.phase, Phase::Requested | Phase::Created)
                    && !is_busy(&taken, &f.name)
                {
                    taken.insert(f.name.clone());
                    found.push(Finding::Online {
                        name: f.name.clone(),
                    });
                }
            }
            // A job runs on it: its instance stays too (deleting that
            // would kill the job all the same) until a listing shows it
            // idle.
            _ if f.busy => {
                orphans.remove(&f.name);
            }
            _ if !is_busy(&taken, &f.name) => {
                orphans.entry(f.name.clone()).or_default().1 = Some(f.id);
            }
            _ => {}
        }
    }
    for (name, (provider_id, forge_id)) in orphans {
        let finding = Finding::Orphan {
            name: name.clone(),
            provider_id,
            forge_id,
        };
        if busy(&finding.op()) || !sightings.sighted(scope, "orphan", &name, &mut seen_now) {
            continue;
        }
        found.push(finding);
    }
    for (name, id) in stale {
        let key = format!("{name}#{id}");
        if busy(&format!("stale:{key}")) || !sightings.sighted(scope, "stale", &key, &mut seen_now)
        {
            continue;
        }
        found.push(Finding::Stale { name, id });
    }
    sightings.settle(scope, &seen_now);
    found
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const POOL: &str = "linux";
    const SCOPE: &str = "pool-id";

    fn world(runners: &[(&str, Phase, Option<u64>)]) -> World {
        let mut w = World::default();
        for &(name, phase, forge_id) in runners {
            let mut r = Runner::requested(name, POOL, None, 0, name, Duration::ZERO);
            r.phase = phase;
            r.forge_runner_id = forge_id;
            w.runners.insert(name.to_owned(), r);
        }
        w
    }

    fn forge_runner(id: u64, name: &str, online: bool, busy: bool) -> ForgeRunner {
        ForgeRunner {
            id,
            name: name.into(),
            online,
            busy,
            paused: false,
            running_jobs: Vec::new(),
        }
    }

    fn stopped(name: &str) -> Instance {
        Instance {
            status: "stopped".into(),
            ..Instance::running(&format!("p-{name}"), name)
        }
    }

    /// The diff of one listing with nothing under way.
    struct Pool {
        world: World,
        sightings: Sightings,
        restarted: HashSet<String>,
        restart_stopped: bool,
        under_way: HashSet<String>,
    }

    impl Pool {
        fn new(world: World) -> Self {
            Self {
                world,
                sightings: Sightings::default(),
                restarted: HashSet::new(),
                restart_stopped: false,
                under_way: HashSet::new(),
            }
        }

        fn list(
            &mut self,
            instances: Option<&[Instance]>,
            forge: Option<&[ForgeRunner]>,
        ) -> Vec<String> {
            let listing = Listing {
                pool: POOL,
                scope: SCOPE,
                restart_stopped: self.restart_stopped,
                instances,
                forge,
            };
            let under_way = &self.under_way;
            diff(
                &mut self.world,
                &listing,
                &|n| under_way.contains(n),
                &mut self.sightings,
                &mut self.restarted,
            )
            .iter()
            .map(describe)
            .collect()
        }
    }

    fn describe(f: &Finding) -> String {
        match f {
            Finding::Interrupted {
                runner,
                instance,
                forge_id,
            } => format!(
                "interrupted {} instance={} forge={forge_id:?}",
                runner.name,
                instance.is_some()
            ),
            Finding::Gone { runner } => format!("gone {}", runner.name),
            Finding::Stopped { runner, start, .. } => {
                format!("stopped {} start={start}", runner.name)
            }
            Finding::Online { name } => format!("online {name}"),
            Finding::Orphan {
                name,
                provider_id,
                forge_id,
            } => format!("orphan {name} instance={provider_id:?} forge={forge_id:?}"),
            Finding::Stale { name, id } => format!("stale {name}#{id}"),
        }
    }

    #[test]
    fn a_runner_the_provider_stops_listing_is_gone_at_the_second_listing_in_a_row() {
        let mut pool = Pool::new(world(&[("a", Phase::Online, Some(1))]));
        let none: &[Instance] = &[];
        assert!(
            pool.list(Some(none), None).is_empty(),
            "one listing is not enough"
        );
        // Listed again in between: the count starts over.
        let listed = [Instance::running("p-a", "a")];
        assert!(pool.list(Some(&listed), None).is_empty());
        assert!(pool.list(Some(none), None).is_empty());
        assert_eq!(pool.list(Some(none), None), ["gone a"]);
        // A failed listing says nothing, and changes nothing.
        assert!(pool.list(None, None).is_empty());
        assert_eq!(pool.world.runners["a"].phase, Phase::Online);
    }

    #[test]
    fn an_interrupted_create_is_found_with_what_the_provider_and_the_forge_made() {
        let mut pool = Pool::new(world(&[
            ("made", Phase::Requested, None),
            ("half", Phase::Requested, None),
            ("mine", Phase::Requested, None),
        ]));
        pool.under_way.insert("mine".into());
        let instances = [
            Instance::running("p-made", "made"),
            Instance::running("p-mine", "mine"),
        ];
        let forge = [forge_runner(7, "made", false, false)];
        assert!(pool.list(Some(&instances), Some(&forge)).is_empty());
        let mut found = pool.list(Some(&instances), Some(&forge));
        found.sort();
        // A create of this replica under way is left to finish.
        assert_eq!(
            found,
            [
                "interrupted half instance=false forge=None",
                "interrupted made instance=true forge=Some(7)"
            ]
        );
    }

    #[test]
    fn a_stopped_instance_is_started_once_then_replaced() {
        let mut pool = Pool::new(world(&[("a", Phase::Online, Some(1))]));
        pool.restart_stopped = true;
        let listed = [stopped("a")];
        assert!(pool.list(Some(&listed), None).is_empty());
        assert_eq!(pool.list(Some(&listed), None), ["stopped a start=true"]);
        assert!(pool.list(Some(&listed), None).is_empty());
        assert_eq!(pool.list(Some(&listed), None), ["stopped a start=false"]);
        // Without `stopped = "start"` it is replaced at once.
        let mut pool = Pool::new(world(&[("b", Phase::Assigned, Some(2))]));
        let listed = [stopped("b")];
        assert!(pool.list(Some(&listed), None).is_empty());
        assert_eq!(pool.list(Some(&listed), None), ["stopped b start=false"]);
    }

    #[test]
    fn orphans_are_what_no_runner_owns_and_one_running_a_job_keeps_its_instance() {
        let mut pool = Pool::new(world(&[("ours", Phase::Online, Some(1))]));
        let instances = [
            Instance::running("p-ours", "ours"),
            Instance::running("p-left", "left"),
            Instance::running("p-busy", "busy"),
        ];
        let forge = [
            forge_runner(1, "ours", true, false),
            forge_runner(2, "left", true, false),
            forge_runner(3, "busy", true, true),
            forge_runner(4, "registered-only", false, false),
        ];
        assert!(pool.list(Some(&instances), Some(&forge)).is_empty());
        assert_eq!(
            pool.list(Some(&instances), Some(&forge)),
            [
                "orphan left instance=Some(\"p-left\") forge=Some(2)",
                "orphan registered-only instance=None forge=Some(4)",
            ]
        );
        // An orphan removal under way is not started twice.
        pool.under_way.insert("orphan:left".into());
        pool.list(Some(&instances), Some(&forge));
        assert!(
            !pool
                .list(Some(&instances), Some(&forge))
                .iter()
                .any(|f| f.starts_with("orphan left"))
        );
        // Its job done, the busy one is an orphan like any other.
        let idle = [
            forge_runner(1, "ours", true, false),
            forge_runner(3, "busy", true, false),
        ];
        assert!(pool.list(Some(&instances), Some(&idle)).is_empty());
        assert_eq!(
            pool.list(Some(&instances), Some(&idle)),
            ["orphan busy instance=Some(\"p-busy\") forge=Some(3)"]
        );
    }

    #[test]
    fn the_forge_listing_settles_ids_and_busy_runners_and_finds_online_and_stale_ones() {
        let mut pool = Pool::new(world(&[
            ("booting", Phase::Created, None),
            ("working", Phase::Online, Some(5)),
            ("twice", Phase::Online, Some(6)),
        ]));
        let instances = [
            Instance::running("p-booting", "booting"),
            Instance::running("p-working", "working"),
            Instance::running("p-twice", "twice"),
        ];
        let forge = [
            forge_runner(4, "booting", true, false),
            forge_runner(5, "working", true, true),
            forge_runner(9, "twice", true, false),
        ];
        // Online needs no second sighting: the forge's word is the event.
        assert_eq!(
            pool.list(Some(&instances), Some(&forge)),
            ["online booting"]
        );
        assert_eq!(pool.world.runners["booting"].forge_runner_id, Some(4));
        assert_eq!(pool.world.runners["working"].phase, Phase::Assigned);
        // The other registration under "twice" is stale at its second
        // listing, and its own id is kept.
        let found = pool.list(Some(&instances), Some(&forge));
        assert!(found.contains(&"stale twice#9".to_owned()), "{found:?}");
        assert_eq!(pool.world.runners["twice"].forge_runner_id, Some(6));
    }

    #[test]
    fn a_name_a_finding_of_this_listing_takes_gets_no_second_one() {
        // Interrupted and online in the same listing: one operation.
        let mut pool = Pool::new(world(&[("a", Phase::Requested, None)]));
        let instances = [Instance::running("p-a", "a")];
        let forge = [forge_runner(3, "a", true, false)];
        assert_eq!(pool.list(Some(&instances), Some(&forge)), ["online a"]);
        assert_eq!(
            pool.list(Some(&instances), Some(&forge)),
            ["interrupted a instance=true forge=Some(3)"]
        );
    }
}
