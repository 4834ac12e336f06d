//! Planning of updates: which containers' cpusets differ from the one last
//! applied, and recording what was actually sent.

use super::arithmetic::ContainerKind;
use super::state::{ContainerEntry, PoolState};
use super::Update;
use crate::cpuset::CpuSet;
use std::borrow::Cow;
use std::cmp::Ordering;
use std::ops::Bound;

impl PoolState {
    /// Every container whose correct cpuset differs from the one last applied,
    /// or whose CFS quota one of its claims wants off and is not yet, sorted
    /// by container id. Containers whose correct cpuset would be empty are
    /// left out (see [`PoolState::stranded`]).
    pub fn plan_updates(&self) -> Vec<Update> {
        let shared = self.shared();
        let mut updates: Vec<Update> = self
            .containers
            .iter()
            .filter(|(_, entry)| !Self::is_current(entry, &shared))
            .filter_map(|(id, entry)| {
                let target = Self::target(entry, &shared)?;
                (*target != entry.cpuset).then(|| update_of(id, entry, target.into_owned()))
            })
            .collect();
        if !self.quota_due.is_empty() {
            self.add_quota_updates(&mut updates);
        }
        updates
    }

    /// Adds to a plan the containers whose quota is due and whose cpuset
    /// is not: rare (a quota learned after its container was created), so
    /// kept out of the loop that runs over every container on every event.
    #[cold]
    #[inline(never)]
    fn add_quota_updates(&self, updates: &mut Vec<Update>) {
        let before = updates.len();
        for id in &self.quota_due {
            let planned = updates[..before]
                .binary_search_by(|u| u.container_id.as_str().cmp(id))
                .is_ok();
            if !planned {
                if let Some(update) = self.planned_update(id) {
                    updates.push(update);
                }
            }
        }
        if updates.len() > before {
            updates.sort_by(|a, b| a.container_id.cmp(&b.container_id));
        }
    }

    /// The update due to one container now, if any (see
    /// [`PoolState::plan_updates`]).
    pub fn planned_update(&self, container_id: &str) -> Option<Update> {
        let (id, entry) = self.containers.get_key_value(container_id)?;
        let shared = self.shared();
        let target = Self::target(entry, &shared)?;
        (self.quota_due.contains(container_id) || *target != entry.cpuset)
            .then(|| update_of(id, entry, target.into_owned()))
    }

    /// Whether [`PoolState::plan_updates`] would return anything, without
    /// building the updates.
    pub fn has_pending(&self) -> bool {
        let shared = self.shared();
        self.containers.values().any(|entry| {
            !Self::is_current(entry, &shared)
                && Self::target(entry, &shared).is_some_and(|target| *target != entry.cpuset)
        }) || self.quota_due.iter().any(|id| {
            self.containers
                .get(id)
                .is_some_and(|entry| Self::target(entry, &shared).is_some())
        })
    }

    /// Whether a container already has its correct cpuset, without building
    /// it: planning runs on every NRI event over every container, and the
    /// mixed union would otherwise be allocated for each mixed container.
    #[inline(always)]
    fn is_current(entry: &ContainerEntry, shared: &CpuSet) -> bool {
        let own = &entry.claim_cpus;
        match entry.kind {
            ContainerKind::Mixed if !own.is_empty() => {
                // own ⊆ exclusive and shared ∩ exclusive = ∅, so the union's
                // size is the sum and containment both ways means equality.
                own.is_subset(&entry.cpuset)
                    && shared.is_subset(&entry.cpuset)
                    && entry.cpuset.len() == own.len() + shared.len()
            }
            _ => false,
        }
    }

    /// The cpuset a container should have now; `None` for an unknown
    /// container or when it would be empty.
    pub fn planned_cpuset(&self, container_id: &str) -> Option<CpuSet> {
        let entry = self.containers.get(container_id)?;
        Self::target(entry, &self.shared()).map(Cow::into_owned)
    }

    /// Containers that cannot be given a correct cpuset because it would be
    /// empty (the shared pool is exhausted); they keep their last cpuset.
    pub fn stranded(&self) -> Vec<String> {
        let shared = self.shared();
        self.containers
            .iter()
            .filter(|(_, entry)| Self::target(entry, &shared).is_none())
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// Record cpusets as applied to their containers (after they were sent to
    /// the runtime). Unknown container ids are ignored.
    pub fn mark_applied(&mut self, updates: &[Update]) {
        let Some((first, _)) = updates.split_first() else {
            return;
        };
        let first = &first.container_id;
        let sorted = updates
            .windows(2)
            .all(|w| w[0].container_id < w[1].container_id);
        // A plan's updates are sorted like the containers: one merge walk
        // instead of a tree lookup per update, once there are enough of them.
        if !sorted || updates.len() < MERGE_THRESHOLD {
            for update in updates {
                if let Some(entry) = self.containers.get_mut(&update.container_id) {
                    if record_applied(entry, update) {
                        Self::note_quota(&mut self.quota_due, &update.container_id, entry);
                    }
                }
            }
            return;
        }
        let mut entries = self
            .containers
            .range_mut::<str, _>((Bound::Included(first.as_str()), Bound::Unbounded));
        let mut next = entries.next();
        for update in updates {
            while let Some((key, entry)) = next.as_mut() {
                match key.as_str().cmp(update.container_id.as_str()) {
                    Ordering::Less => next = entries.next(),
                    Ordering::Equal => {
                        if record_applied(entry, update) {
                            Self::note_quota(&mut self.quota_due, key, entry);
                        }
                        next = entries.next();
                        break;
                    }
                    // Unknown id: ignored.
                    Ordering::Greater => break,
                }
            }
            if next.is_none() {
                return;
            }
        }
    }

    /// Records the cpuset a container's cgroup was found holding, when the
    /// cpuset last applied to it is still `applied` and the cgroup holds
    /// another: someone else wrote it, or the runtime reported an update as
    /// done that never reached the cgroup. The next plan then sends the
    /// correct cpuset again. `false` (nothing recorded) for an unknown
    /// container, one updated since `applied` was read, or one that holds it.
    pub fn note_found(&mut self, container_id: &str, applied: &CpuSet, found: &CpuSet) -> bool {
        match self.containers.get_mut(container_id) {
            Some(entry) if entry.cpuset == *applied && entry.cpuset != *found => {
                entry.cpuset = found.clone();
                true
            }
            _ => false,
        }
    }

    #[inline(always)]
    fn target<'s>(entry: &'s ContainerEntry, shared: &'s CpuSet) -> Option<Cow<'s, CpuSet>> {
        let own = &entry.claim_cpus;
        let target = match entry.kind {
            ContainerKind::Shared => Cow::Borrowed(shared),
            // A claim container whose claims were all unprepared must leave
            // their CPUs, which may be handed to another claim.
            ContainerKind::Exclusive if own.is_empty() => Cow::Borrowed(shared),
            ContainerKind::Exclusive => Cow::Borrowed(own),
            ContainerKind::Mixed => Cow::Owned(own.union(shared)),
        };
        (!target.is_empty()).then_some(target)
    }
}

/// From this many updates on, [`PoolState::mark_applied`] walks the
/// containers once instead of looking each update up.
const MERGE_THRESHOLD: usize = 16;

/// Records an update as applied to its container; `true` when the
/// container's quota may be due or paid by it (its claims want none), so
/// [`PoolState::note_quota`] must look: containers whose claims want the
/// quota are never in the set, and the hot path touches no set for them.
fn record_applied(entry: &mut ContainerEntry, update: &Update) -> bool {
    if entry.cpuset != update.cpuset {
        entry.cpuset = update.cpuset.clone();
    }
    entry.cfs_quota_off = update.cfs_quota_off;
    entry.wants_no_cfs_quota
}

/// The update of a container to `target`, with its quota off when its
/// claims ask so: every update of such a container keeps the quota off (an
/// in-place resize may have put the CPU limit's quota back).
#[inline(always)]
fn update_of(id: &str, entry: &ContainerEntry, target: CpuSet) -> Update {
    Update {
        container_id: id.to_string(),
        cpuset: target,
        cfs_quota_off: entry.wants_no_cfs_quota,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::assignment::ClaimAssignment;
    use crate::claim_env::EnvClaim;
    use crate::pool::fixtures::*;
    use proptest::prelude::*;

    #[test]
    fn deferred_updates_are_planned_until_sent_and_dropped_when_moot() {
        let mut s = node(false);
        s.admit("c1", "p", "app", &[], None).expect("shared");
        let shrink = s.add_claim(claim("aa", "7", "p2")).expect("claim");
        assert_eq!(shrink, updates(&[("c1", "1-6")]));
        // Not sent: the next event's reply carries it.
        let a = s.admit("c2", "p", "other", &[], None).expect("shared");
        assert_eq!(a.placement.cpuset, set("1-6"));
        assert_eq!(a.updates, updates(&[("c1", "1-6")]));
        // Unprepared before anything was sent: c1 already has the right set.
        let up = s.remove_claim("aa");
        assert_eq!(up, updates(&[("c2", "1-7")]));
    }

    #[test]
    fn a_cpuset_found_other_than_applied_is_planned_again() {
        let mut s = node(true);
        s.add_claim(claim("aa", "7", "q")).expect("claim");
        s.admit("shared", "p", "app", &[], None).expect("shared");
        let mixed = s
            .admit("mixed", "q", "app", &[cref("aa", "7")], Some(512))
            .expect("mixed");
        assert_eq!(mixed.placement.kind, ContainerKind::Mixed);
        s.mark_applied(&[
            Update::cpuset("mixed", mixed.placement.cpuset),
            Update::cpuset("shared", set("1-6")),
        ]);
        assert!(s.plan_updates().is_empty(), "settled");
        let (shared, mixed) = (set("1-6"), set("1-7"));
        assert_eq!(s.container("shared").map(|e| &e.cpuset), Some(&shared));
        assert_eq!(s.container("mixed").map(|e| &e.cpuset), Some(&mixed));

        let cases: [(&str, &CpuSet, &str, bool); 5] = [
            // What was applied: nothing to do.
            ("shared", &shared, "1-6", false),
            // Updated since the cgroup was read: the reading is stale.
            ("shared", &mixed, "1-3", false),
            ("gone", &shared, "1-3", false),
            ("shared", &shared, "1-3", true),
            // A mixed container's union is judged as a whole.
            ("mixed", &mixed, "7", true),
        ];
        for (id, applied, found, noted) in cases {
            assert_eq!(
                s.note_found(id, applied, &set(found)),
                noted,
                "{id} found {found}"
            );
        }
        assert_eq!(
            s.plan_updates(),
            updates(&[("mixed", "1-7"), ("shared", "1-6")]),
            "both get their correct cpuset again"
        );
        s.mark_applied(&s.plan_updates());
        assert!(!s.has_pending());
    }

    // ---- property test: every step agrees with a from-scratch computation.

    #[derive(Debug, Clone)]
    enum Op {
        AddClaim {
            claim: usize,
            cpus: Vec<u32>,
            cfs_quota_off: bool,
        },
        RemoveClaim {
            claim: usize,
        },
        Admit {
            container: usize,
            pod: usize,
            claims: Vec<usize>,
            shares: Option<u64>,
        },
        RemoveContainer {
            container: usize,
        },
        Resync {
            mixed: bool,
        },
    }

    const CPUS: u32 = 16;

    fn claim_uid(i: usize) -> String {
        format!("c{i:x}")
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => (0usize..6, proptest::collection::vec(1u32..CPUS, 1..4), any::<bool>())
                .prop_map(|(claim, cpus, cfs_quota_off)| Op::AddClaim { claim, cpus, cfs_quota_off }),
            1 => (0usize..6).prop_map(|claim| Op::RemoveClaim { claim }),
            4 => (0usize..10, 0usize..3, proptest::collection::vec(0usize..6, 0..3),
                  proptest::option::of(prop_oneof![Just(2u64), Just(3u64), Just(1024u64)]))
                .prop_map(|(container, pod, claims, shares)| Op::Admit { container, pod, claims, shares }),
            1 => (0usize..10).prop_map(|container| Op::RemoveContainer { container }),
            1 => any::<bool>().prop_map(|mixed| Op::Resync { mixed }),
        ]
    }

    /// The cpuset a container should have, computed only from the claims and
    /// its kind, independently of the incremental bookkeeping.
    fn from_scratch(s: &PoolState, entry: &ContainerEntry) -> CpuSet {
        let exclusive: CpuSet = s.claims().values().flat_map(|c| c.cpus.iter()).collect();
        let shared: CpuSet = s
            .allocatable()
            .iter()
            .filter(|c| !exclusive.contains(*c))
            .collect();
        let own: CpuSet = entry
            .claims
            .iter()
            .filter_map(|u| s.claim(u))
            .flat_map(|c| c.cpus.iter())
            .collect();
        match entry.kind {
            ContainerKind::Shared => shared,
            ContainerKind::Exclusive if own.is_empty() => shared,
            ContainerKind::Exclusive => own,
            ContainerKind::Mixed => own.union(&shared),
        }
    }

    proptest! {
        #[test]
        fn every_step_matches_a_from_scratch_plan(mixed in any::<bool>(), ops in proptest::collection::vec(op(), 1..40)) {
            let mut s = PoolState::new((0..CPUS).collect(), set("0"), mixed);
            let pods = ["pod-0", "pod-1", "pod-2"];
            for op in ops {
                let applied = match op {
                    Op::AddClaim { claim: i, cpus, cfs_quota_off } => {
                        let mut a = claim(&claim_uid(i), "", pods[i % 3]);
                        a.cpus = cpus.into_iter().collect();
                        a.tuning.cfs_quota_off = cfs_quota_off;
                        let before = s.exclusive().clone();
                        match s.add_claim(a.clone()) {
                            Ok(up) => up,
                            Err(_) => {
                                prop_assert_eq!(s.exclusive(), &before);
                                Vec::new()
                            }
                        }
                    }
                    Op::RemoveClaim { claim } => s.remove_claim(&claim_uid(claim)),
                    Op::Admit { container, pod, claims, shares } => {
                        let refs: Vec<EnvClaim> = claims
                            .iter()
                            .filter_map(|i| s.claim(&claim_uid(*i)))
                            .map(|c| EnvClaim { claim_uid: c.claim_uid.clone(), cpus: c.cpus.clone() })
                            .collect();
                        let mut refs_dedup: Vec<EnvClaim> = Vec::new();
                        for r in refs {
                            if !refs_dedup.contains(&r) { refs_dedup.push(r); }
                        }
                        let id = format!("k{container}");
                        match s.admit(&id, pods[pod], &format!("n{container}"), &refs_dedup, shares) {
                            Ok(a) => {
                                prop_assert_eq!(Some(&a.placement.cpuset), s.container(&id).map(|c| &c.cpuset));
                                prop_assert!(a.updates.iter().all(|u| u.container_id != id));
                                a.updates
                            }
                            Err(_) => Vec::new(),
                        }
                    }
                    Op::RemoveContainer { container } => {
                        s.remove_container(&format!("k{container}"));
                        Vec::new()
                    }
                    Op::Resync { mixed } => {
                        let claims: Vec<ClaimAssignment> = s.claims().values().cloned().collect();
                        s.resync((0..CPUS).collect(), set("0"), mixed, claims).expect("valid claims")
                    }
                };
                prop_assert!(applied.windows(2).all(|w| w[0].container_id < w[1].container_id), "sorted, unique");
                for u in &applied {
                    let entry = s.container(&u.container_id).expect("update for a known container");
                    let quota_due = entry.wants_no_cfs_quota && !entry.cfs_quota_off;
                    prop_assert!(entry.cpuset != u.cpuset || quota_due, "only changed containers");
                    prop_assert!(!u.cpuset.is_empty());
                    prop_assert_eq!(u.cfs_quota_off, entry.wants_no_cfs_quota);
                }
                prop_assert_eq!(s.has_pending(), !applied.is_empty());
                let owed: std::collections::BTreeSet<String> = s
                    .containers()
                    .iter()
                    .filter(|(_, e)| e.wants_no_cfs_quota && !e.cfs_quota_off)
                    .map(|(id, _)| id.clone())
                    .collect();
                prop_assert_eq!(&s.quota_due, &owed);
                s.mark_applied(&applied);
                prop_assert!(s.plan_updates().is_empty());
                prop_assert!(!s.has_pending());

                let mut exclusive_seen = CpuSet::new();
                for (id, entry) in s.containers() {
                    let want = from_scratch(&s, entry);
                    if want.is_empty() {
                        prop_assert!(s.stranded().contains(id));
                        continue;
                    }
                    prop_assert_eq!(&entry.cpuset, &want, "container {}", id);
                    let own: Vec<&ClaimAssignment> = entry.claims.iter().filter_map(|u| s.claim(u)).collect();
                    // Computed from the claims, not the cached wish: a
                    // container whose claims ask for no quota has none.
                    if own.iter().any(|c| c.tuning.cfs_quota_off) {
                        prop_assert!(entry.cfs_quota_off, "quota of {} still on", id);
                    }
                    if entry.kind == ContainerKind::Exclusive && !own.is_empty() {
                        prop_assert!(entry.cpuset.is_disjoint(&exclusive_seen), "exclusive overlap at {}", id);
                        exclusive_seen = exclusive_seen.union(&entry.cpuset);
                    }
                    for c in s.claims().values() {
                        if !own.iter().any(|o| o.claim_uid == c.claim_uid) {
                            prop_assert!(entry.cpuset.is_disjoint(&c.cpus), "{} on claim {}", id, c.claim_uid);
                        }
                    }
                    prop_assert!(entry.cpuset.is_disjoint(s.reserved()));
                }
                let mut owners = std::collections::HashSet::new();
                for entry in s.containers().values() {
                    for u in &entry.claims {
                        prop_assert!(owners.insert(u.clone()), "claim {} has two containers", u);
                    }
                }
            }
        }
    }

    // ---- property tests: the fast paths equal straightforward references.

    /// Marking by one lookup per update, as the reference for the merge walk.
    fn mark_by_lookup(s: &mut PoolState, updates: &[Update]) {
        for u in updates {
            if let Some(entry) = s.containers.get_mut(&u.container_id) {
                entry.cpuset = u.cpuset.clone();
                entry.cfs_quota_off = u.cfs_quota_off;
            }
        }
    }

    fn cpusets(s: &PoolState) -> Vec<(String, CpuSet, bool)> {
        s.containers()
            .iter()
            .map(|(id, e)| (id.clone(), e.cpuset.clone(), e.cfs_quota_off))
            .collect()
    }

    proptest! {
        #[test]
        fn mark_applied_equals_one_lookup_per_update(
            known in proptest::collection::btree_set(0u32..200, 0..60),
            marks in proptest::collection::vec((0u32..220, 0u32..16, any::<bool>()), 0..80),
            sort in any::<bool>(),
        ) {
            let mut s = PoolState::new((0..16).collect(), CpuSet::new(), false);
            for k in &known {
                s.place(&format!("k{k:03}"), "p", &format!("n{k}"), &[], None).expect("shared");
            }
            // Ids known and unknown, sorted or not, repeated when unsorted.
            let mut updates: Vec<Update> = marks
                .iter()
                .map(|(k, cpu, quota_off)| Update {
                    container_id: format!("k{k:03}"),
                    cpuset: [*cpu].into_iter().collect(),
                    cfs_quota_off: *quota_off,
                })
                .collect();
            if sort {
                updates.sort_by(|a, b| a.container_id.cmp(&b.container_id));
                updates.dedup_by(|a, b| a.container_id == b.container_id);
            }
            let mut reference = s.clone();
            mark_by_lookup(&mut reference, &updates);
            s.mark_applied(&updates);
            prop_assert_eq!(cpusets(&s), cpusets(&reference));
        }

        /// Placing containers one by one and planning once at the end gives
        /// the state and the plan of admitting them one by one.
        #[test]
        fn placing_then_planning_once_equals_admitting_each(
            mixed in any::<bool>(),
            claims in proptest::collection::vec(proptest::collection::vec(1u32..CPUS, 1..4), 0..6),
            containers in proptest::collection::vec(
                (0usize..12, 0usize..3, proptest::collection::vec(0usize..6, 0..3),
                 proptest::option::of(prop_oneof![Just(2u64), Just(3u64), Just(1024u64)]),
                 proptest::collection::vec(0u32..CPUS, 0..4)),
                0..30),
        ) {
            let pods = ["pod-0", "pod-1", "pod-2"];
            let mut base = PoolState::new((0..CPUS).collect(), set("0"), mixed);
            for (i, cpus) in claims.into_iter().enumerate() {
                let mut a = claim(&claim_uid(i), "", pods[i % 3]);
                a.cpus = cpus.into_iter().collect();
                let _ = base.add_claim(a);
            }
            let mut admitted = base.clone();
            let mut placed = base;
            for (c, pod, claims, shares, reported) in containers {
                let mut refs: Vec<EnvClaim> = Vec::new();
                for i in claims {
                    if let Some(cl) = admitted.claim(&claim_uid(i)) {
                        let r = EnvClaim { claim_uid: cl.claim_uid.clone(), cpus: cl.cpus.clone() };
                        if !refs.contains(&r) { refs.push(r); }
                    }
                }
                let id = format!("k{c:02}");
                let name = format!("n{c}");
                let a = admitted.admit(&id, pods[pod], &name, &refs, shares);
                let p = placed.place(&id, pods[pod], &name, &refs, shares);
                match (a, p) {
                    (Ok(a), Ok(p)) => {
                        prop_assert_eq!(&a.placement, &p);
                        // What a runtime reports for the container.
                        let now = Update::cpuset(id.clone(), reported.into_iter().collect());
                        admitted.mark_applied(std::slice::from_ref(&now));
                        placed.mark_applied(std::slice::from_ref(&now));
                    }
                    (Err(a), Err(p)) => prop_assert_eq!(a, p),
                    (a, p) => prop_assert!(false, "admit {:?} but place {:?}", a, p),
                }
            }
            prop_assert_eq!(cpusets(&placed), cpusets(&admitted));
            prop_assert_eq!(placed.plan_updates(), admitted.plan_updates());
            prop_assert_eq!(placed.has_pending(), !admitted.plan_updates().is_empty());
        }
    }
}
