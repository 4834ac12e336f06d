//! Planning: the cpuset of a container being created, resized, stopped or
//! removed, and the other containers' cpusets that change with it. Nothing
//! here records an update as applied.

use shared_state::claim_env::EnvClaim;
use shared_state::pool::arithmetic::ContainerKind;
use shared_state::pool::Update;
use shared_state::CpuSet;

use super::refusal::Refusal;
use super::{ContainerInfo, NodeView};

/// What [`NodeView::create`] decided for a container being created.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CreateOutcome {
    /// The container is admitted with this cpuset.
    Decided(CreateDecision),
    /// The container names a claim the view does not know yet: resolve it
    /// (see [`super::admit_container`]) and ask again.
    UnknownClaim(String),
    /// The container is refused.
    Refused(Refusal),
}

impl CreateOutcome {
    /// The decision, or the outcome itself when there is none.
    pub fn decided(self) -> Result<CreateDecision, CreateOutcome> {
        match self {
            CreateOutcome::Decided(decision) => Ok(decision),
            other => Err(other),
        }
    }
}

/// The decision for a container being created.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateDecision {
    pub kind: ContainerKind,
    /// The container's cpuset; never empty.
    pub cpuset: CpuSet,
    /// NUMA nodes for `cpuset.mems` (`--align-memory`, claim containers only):
    /// those of every CPU in `cpuset`.
    pub mems: Option<CpuSet>,
    /// Cpusets of other containers to change in the same reply.
    pub updates: Vec<Update>,
    /// The claims the container holds.
    pub claims: Vec<String>,
    /// One of its claims asked for no CFS quota (`tuning.cfsQuota: off`):
    /// the container gets none, whatever its CPU limit.
    pub cfs_quota_off: bool,
}

/// The decision for a container whose resources the runtime is updating.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpdateDecision {
    /// The container's kind before and after; `None` for a container the
    /// view does not know (it is left as the runtime has it).
    pub kinds: Option<(ContainerKind, ContainerKind)>,
    /// New `cpuset.mems` for the container itself (`--align-memory`, when
    /// its kind changed).
    pub mems: Option<CpuSet>,
    /// Updates to apply, the container's own included, sorted by id. The
    /// container's own keeps its CFS quota off when its claims ask so (the
    /// runtime would otherwise apply the CRI request's quota).
    pub updates: Vec<Update>,
}

impl NodeView {
    /// Decide the cpuset of a container being created. Nothing changes
    /// unless the outcome is [`CreateOutcome::Decided`].
    pub fn create(&mut self, info: &ContainerInfo) -> CreateOutcome {
        let refs = match Self::env_claims(info) {
            Ok(refs) => refs,
            Err(refusal) => return CreateOutcome::Refused(refusal),
        };
        let adopted = self.adopt_provisional(&refs, &info.pod_uid);
        let admission =
            match self
                .pool
                .admit(&info.id, &info.pod_uid, &info.name, &refs, info.cpu_shares)
            {
                Ok(admission) => admission,
                Err(source) => {
                    // A claim to look up first is no refusal: the adoption
                    // stands while it is asked for, so no other pod takes
                    // the claim meanwhile.
                    if source.unknown_claim().is_none() {
                        self.restore_provisional(adopted);
                    }
                    return match source.unknown_claim() {
                        Some(uid) => CreateOutcome::UnknownClaim(uid.to_string()),
                        None => CreateOutcome::Refused(Refusal::Pool {
                            name: info.name.clone(),
                            pod_uid: info.pod_uid.clone(),
                            source,
                        }),
                    };
                }
            };
        // The memory nodes of every CPU the container runs on: an exclusive
        // container's claim, a mixed container's claim and the shared pool
        // (its memory must not be confined to the claim's node while it
        // also runs on the others).
        let mems = match (admission.placement.kind, &self.numa) {
            (ContainerKind::Shared, _) | (_, None) => None,
            (_, Some(numa)) => numa.nodes_of(&admission.placement.cpuset),
        };
        let cfs_quota_off = self.cfs_quota_off(&info.id);
        CreateOutcome::Decided(CreateDecision {
            kind: admission.placement.kind,
            cpuset: admission.placement.cpuset,
            mems,
            updates: admission.updates,
            claims: refs.into_iter().map(|r| r.claim_uid).collect(),
            cfs_quota_off,
        })
    }

    /// The CPUs to put in the container's isolated partition, when one of
    /// its claims asks for `tuning.loadBalancing: off` (such a container is
    /// never mixed: it runs on its claims' CPUs alone).
    pub fn isolated_cpus(&self, container_id: &str) -> Option<CpuSet> {
        self.pool.isolated_cpus(container_id)
    }

    /// For a node that makes no isolated partitions: a placed container
    /// whose claim asks for one leaves the view again and is refused.
    pub fn refuse_unisolable(&mut self, info: &ContainerInfo) -> Result<(), Refusal> {
        let Some(cpus) = self.isolated_cpus(&info.id) else {
            return Ok(());
        };
        self.remove_container(&info.id);
        Err(Refusal::Unisolable {
            container: info.id.clone(),
            name: info.name.clone(),
            pod_uid: info.pod_uid.clone(),
            cpus,
        })
    }

    /// Whether one of the container's claims, prepared now, asks for no
    /// CFS quota (`tuning.cfsQuota: off`).
    pub fn cfs_quota_off(&self, container_id: &str) -> bool {
        self.pool
            .container(container_id)
            .is_some_and(|entry| entry.wants_no_cfs_quota)
    }

    /// The CPUs of the container's claims (`None`: it runs on none).
    pub fn claim_cpus(&self, container_id: &str) -> Option<CpuSet> {
        self.pool.claim_cpus(container_id)
    }

    /// A container stopped: it leaves the view (its claim stays prepared, so
    /// a restarted container gets the same CPUs). Returns pending updates of
    /// the remaining containers.
    pub fn stop_container(&mut self, container_id: &str) -> Vec<Update> {
        self.pool.remove_container(container_id);
        self.pool.plan_updates()
    }

    /// The runtime removed a container.
    pub fn remove_container(&mut self, container_id: &str) {
        self.pool.remove_container(container_id);
    }

    /// The runtime is updating a container's resources: kubelet resizing a
    /// pod in place sends CRI `UpdateContainerResources` with the new CPU
    /// request as `cpu.shares`, which the runtime passes to NRI
    /// `UpdateContainer`. The container is re-classified at once (a claim
    /// container gaining a request in mixed mode becomes mixed, one losing it
    /// becomes exclusive; a shared container stays shared), so later pool
    /// changes follow its new kind. The updates always include the
    /// container's own cpuset: the runtime merges it over the CRI request,
    /// so a cpuset in that request (or none) cannot unpin the container.
    pub fn update_container(&mut self, info: &ContainerInfo) -> UpdateDecision {
        let mut kinds = None;
        if let Some(entry) = self.pool.container(&info.id).cloned() {
            let refs: Vec<EnvClaim> = entry
                .claims
                .iter()
                .filter_map(|uid| self.pool.claim(uid))
                .map(|c| EnvClaim {
                    claim_uid: c.claim_uid.clone(),
                    cpus: c.cpus.clone(),
                })
                .collect();
            let shares = info.cpu_shares.or(entry.cpu_shares);
            match self
                .pool
                .place(&info.id, &entry.pod_uid, &entry.name, &refs, shares)
            {
                Ok(placed) => kinds = Some((entry.kind, placed.kind)),
                Err(err) => {
                    tracing::warn!(container = %info.id, error = %err, "keeping the container's placement");
                    kinds = Some((entry.kind, entry.kind));
                }
            }
        }
        let mut updates = self.pool.plan_updates();
        let own = self.pool.planned_cpuset(&info.id);
        if let Some(own) = &own {
            if !updates.iter().any(|u| u.container_id == info.id) {
                updates.push(Update {
                    container_id: info.id.clone(),
                    cpuset: own.clone(),
                    cfs_quota_off: self.cfs_quota_off(&info.id),
                });
                updates.sort_by(|a, b| a.container_id.cmp(&b.container_id));
            }
        }
        // A kind change moves the container's memory with its CPUs, as at
        // creation: the NUMA nodes of every CPU it now runs on.
        let mems = match (kinds, &self.numa, &own) {
            (Some((before, after)), Some(numa), Some(own))
                if before != after && after != ContainerKind::Shared =>
            {
                numa.nodes_of(own)
            }
            _ => None,
        };
        UpdateDecision {
            kinds,
            mems,
            updates,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::*;
    use crate::view::numa::NumaMap;

    #[test]
    fn kinds_and_cpusets_table() {
        // (mixed mode, env, shares, kind, cpuset)
        let e1 = env(CLAIM_1, "2-3");
        type Case<'a> = (bool, Vec<&'a str>, Option<u64>, ContainerKind, &'a str);
        let cases: Vec<Case> = vec![
            (false, vec![], None, ContainerKind::Shared, "1,4-7"),
            (true, vec![], Some(1024), ContainerKind::Shared, "1,4-7"),
            (false, vec![&e1], None, ContainerKind::Exclusive, "2-3"),
            (
                false,
                vec![&e1],
                Some(1024),
                ContainerKind::Exclusive,
                "2-3",
            ),
            (true, vec![&e1], Some(2), ContainerKind::Exclusive, "2-3"),
            (true, vec![&e1], None, ContainerKind::Exclusive, "2-3"),
            (true, vec![&e1], Some(3), ContainerKind::Mixed, "1-7"),
            (
                true,
                vec![&e1, "OTHER=1"],
                Some(512),
                ContainerKind::Mixed,
                "1-7",
            ),
        ];
        for (mixed, env, shares, kind, cpus) in cases {
            let mut v = view(mixed);
            v.apply_prepared(1, claim(CLAIM_1, "2-3", POD_A))
                .expect("claim");
            let d = v
                .create(&container("new", POD_A, &env, shares))
                .decided()
                .unwrap_or_else(|e| panic!("{env:?} {shares:?}: {e:?}"));
            assert_eq!(
                (d.kind, d.cpuset),
                (kind, set(cpus)),
                "{mixed} {env:?} {shares:?}"
            );
        }
    }

    #[test]
    fn refusals_table() {
        let owner_env = env(CLAIM_1, "2-3");
        let cases: Vec<(&str, ContainerInfo, &str, &str)> = vec![
            (
                "forged cpus",
                container("x", POD_A, &[&env(CLAIM_1, "2-4")], None),
                "cpus-mismatch",
                "the container environment says CPUs 2-4 but the claim was prepared with 2-3",
            ),
            (
                "other pod",
                container("x", POD_B, &[&owner_env], None),
                "wrong-pod",
                "not for pod bbbbbbbb",
            ),
            (
                "second container",
                container("x", POD_A, &[&owner_env], None),
                "claim-owned",
                "already belongs to container owner",
            ),
            (
                "malformed",
                container("x", POD_A, &["DRA_CPUSET_XYZ=1"], None),
                "bad-env",
                "is not a Kubernetes UID",
            ),
            (
                "empty list",
                container("x", POD_A, &[&format!("DRA_CPUSET_{CLAIM_2}=")], None),
                "bad-env",
                "the cpulist is empty",
            ),
        ];
        for (what, info, reason, text) in cases {
            let mut v = view(false);
            v.apply_prepared(1, claim(CLAIM_1, "2-3", POD_A))
                .expect("claim");
            let mut owner = container("owner", POD_A, &[&owner_env], None);
            owner.name = "app".into();
            v.create(&owner).decided().expect("owner");
            let before = v.pool().containers().len();
            let refusal = match v.create(&info).decided() {
                Err(CreateOutcome::Refused(r)) => r,
                other => panic!("{what}: {other:?}"),
            };
            assert_eq!(refusal.reason(), reason, "{what}");
            assert!(refusal.to_string().contains(text), "{what}: {refusal}");
            assert!(
                refusal.to_string().starts_with("dra-cpu refuses container"),
                "{refusal}"
            );
            assert_eq!(v.pool().containers().len(), before, "{what}: nothing added");
        }
    }

    #[test]
    fn unknown_claim_asks_for_resolution() {
        let mut v = view(false);
        let info = container("x", POD_A, &[&env(CLAIM_2, "5")], None);
        assert_eq!(
            v.create(&info),
            CreateOutcome::UnknownClaim(CLAIM_2.to_string())
        );
    }

    #[test]
    fn a_claim_asking_no_cfs_quota_gives_its_containers_none_and_only_them() {
        let mut v = view(true);
        let mut quota_off = claim(CLAIM_1, "2-3", POD_A);
        quota_off.tuning.cfs_quota_off = true;
        v.apply_prepared(1, quota_off).expect("claim 1");
        v.apply_prepared(2, claim(CLAIM_2, "4", POD_B))
            .expect("claim 2");
        let created = |v: &mut NodeView, id: &str, pod: &str, env: &[&str], shares| {
            v.create(&container(id, pod, env, shares))
                .decided()
                .expect("decided")
                .cfs_quota_off
        };
        let e1 = env(CLAIM_1, "2-3");
        assert!(created(&mut v, "e", POD_A, &[&e1], None), "exclusive");
        // A claim has one container at a time.
        v.remove_container("e");
        assert!(created(&mut v, "m", POD_A, &[&e1], Some(100)), "mixed");
        assert!(
            !created(&mut v, "o", POD_B, &[&env(CLAIM_2, "4")], None),
            "untuned claim"
        );
        assert!(!created(&mut v, "s", POD_B, &[], None), "shared");
        // A resize keeps it off.
        let own_quota_off = |d: UpdateDecision, id: &str| {
            d.updates
                .iter()
                .find(|u| u.container_id == id)
                .map(|u| u.cfs_quota_off)
        };
        assert_eq!(
            own_quota_off(
                v.update_container(&container("m", POD_A, &[&e1], Some(200))),
                "m"
            ),
            Some(true)
        );
        assert_eq!(
            own_quota_off(
                v.update_container(&container("s", POD_B, &[], Some(200))),
                "s"
            ),
            Some(false)
        );
    }

    #[test]
    fn claim_container_shrinks_shared_and_mixed_in_the_same_reply() {
        let mut v = view(true);
        let shared = v
            .create(&container("s", POD_B, &[], None))
            .decided()
            .expect("shared");
        assert_eq!(shared.cpuset, set("1-7"));
        v.apply_prepared(1, claim(CLAIM_1, "2-3", POD_A))
            .expect("claim 1");
        let mixed = v
            .create(&container("m", POD_A, &[&env(CLAIM_1, "2-3")], Some(100)))
            .decided()
            .expect("mixed");
        assert_eq!(mixed.cpuset, set("1-7"));
        // The shrink of "s" was deferred; it rides on this reply.
        assert_eq!(mixed.updates, updates(&[("s", "1,4-7")]));
        v.mark_applied(&mixed.updates);

        let shrink = v
            .apply_prepared(2, claim(CLAIM_2, "6", POD_B))
            .expect("claim 2");
        assert_eq!(shrink, updates(&[("m", "1-5,7"), ("s", "1,4-5,7")]));
        let excl = v
            .create(&container("e", POD_B, &[&env(CLAIM_2, "6")], None))
            .decided()
            .expect("excl");
        assert_eq!(excl.cpuset, set("6"));
        assert_eq!(excl.updates, shrink, "deferred shrink sent with the create");
        v.mark_applied(&excl.updates);
        assert!(v.pending_updates().is_empty());

        // Unprepare grows them back.
        let grow = v.apply_unprepared(3, CLAIM_2).expect("unprepare");
        assert_eq!(
            grow,
            updates(&[("e", "1,4-7"), ("m", "1-7"), ("s", "1,4-7")])
        );
    }

    #[test]
    fn empty_shared_pool_refuses_shared_and_keeps_existing() {
        let mut v = NodeView::new(set("0-1"), set(""), false, None);
        v.create(&container("s", POD_B, &[], None))
            .decided()
            .expect("shared");
        v.apply_prepared(1, claim(CLAIM_1, "0-1", POD_A))
            .expect("all CPUs");
        assert_eq!(v.stranded(), vec!["s".to_string()]);
        assert!(v.pending_updates().is_empty(), "no empty cpuset planned");
        let r = match v.create(&container("t", POD_B, &[], None)).decided() {
            Err(CreateOutcome::Refused(r)) => r,
            other => panic!("{other:?}"),
        };
        assert_eq!(r.reason(), "empty-shared-pool");
        assert!(r.to_string().contains("the shared pool is empty"), "{r}");
    }

    /// CPUs 0-3 on NUMA node 0, 4-7 on node 1.
    fn two_numa_nodes() -> shared_state::topology::Topology {
        use shared_state::topology::synthetic::{build, Shape, SiblingNumbering};
        build(&Shape {
            sockets: 2,
            numa_per_socket: 1,
            l3_per_numa: 1,
            cores_per_l3: 4,
            threads_per_core: 1,
            sibling_numbering: SiblingNumbering::Adjacent,
        })
    }

    #[test]
    fn align_memory_sets_the_claims_numa_nodes() {
        let topo = two_numa_nodes();
        let numa = NumaMap::from_topology(&topo);
        assert_eq!(numa.nodes_of(&set("0-3")), Some(set("0")));
        assert_eq!(numa.nodes_of(&set("3-4")), Some(set("0-1")));
        assert_eq!(numa.nodes_of(&set("9")), None, "unknown CPU: no guess");
        let mut v = NodeView::new(set("0-7"), set(""), true, Some(numa));
        v.apply_prepared(1, claim(CLAIM_1, "5-6", POD_A))
            .expect("claim");
        v.apply_prepared(2, claim(CLAIM_2, "7", POD_B))
            .expect("claim");
        let excl = v
            .create(&container("e", POD_A, &[&env(CLAIM_1, "5-6")], None))
            .decided()
            .expect("exclusive");
        assert_eq!(excl.kind, ContainerKind::Exclusive);
        assert_eq!(
            excl.mems,
            Some(set("1")),
            "an exclusive container: its claim's node"
        );
        let mixed = v
            .create(&container("m", POD_B, &[&env(CLAIM_2, "7")], Some(100)))
            .decided()
            .expect("mixed");
        assert_eq!(mixed.kind, ContainerKind::Mixed);
        assert_eq!(mixed.cpuset, set("0-4,7"));
        assert_eq!(
            mixed.mems,
            Some(set("0-1")),
            "a mixed container: its claim's node and the shared pool's nodes"
        );
        let shared = v
            .create(&container("s", POD_B, &[], None))
            .decided()
            .expect("shared");
        assert_eq!(shared.mems, None);
    }

    #[test]
    fn update_container_reclassifies_and_repins_itself() {
        use ContainerKind::{Exclusive, Mixed, Shared};
        // (mixed mode, has a claim, shares at creation, shares updated to,
        //  kinds before and after, the container's own cpuset after).
        // Allocatable 1-7 (0 reserved), the claim holds 2-3: pool 1,4-7.
        type Case = (
            bool,
            bool,
            Option<u64>,
            Option<u64>,
            (ContainerKind, ContainerKind),
            &'static str,
        );
        let cases: [Case; 9] = [
            (true, true, Some(2), Some(512), (Exclusive, Mixed), "1-7"),
            (true, true, None, Some(3), (Exclusive, Mixed), "1-7"),
            (true, true, Some(512), Some(2), (Mixed, Exclusive), "2-3"),
            (true, true, Some(512), Some(1024), (Mixed, Mixed), "1-7"),
            (true, true, Some(2), Some(2), (Exclusive, Exclusive), "2-3"),
            // Mode off: a request never makes a claim container mixed.
            (
                false,
                true,
                Some(2),
                Some(512),
                (Exclusive, Exclusive),
                "2-3",
            ),
            // A shared container keeps the shared pool whatever it requests.
            (true, false, Some(512), Some(2), (Shared, Shared), "1,4-7"),
            (true, false, Some(2), Some(512), (Shared, Shared), "1,4-7"),
            (false, false, None, Some(100), (Shared, Shared), "1,4-7"),
        ];
        for (i, (mixed, has_claim, at_create, to, kinds, own)) in cases.into_iter().enumerate() {
            let mut v = view(mixed);
            v.apply_prepared(1, claim(CLAIM_1, "2-3", POD_A))
                .expect("claim");
            let claim_env = env(CLAIM_1, "2-3");
            let envs: Vec<&str> = if has_claim { vec![&claim_env] } else { vec![] };
            let mut info = container("c", POD_A, &envs, at_create);
            let created = v.create(&info).decided().expect("created");
            v.mark_applied(&[Update::cpuset("c", created.cpuset)]);
            info.cpu_shares = to;
            let decision = v.update_container(&info);
            assert_eq!(decision.kinds, Some(kinds), "case {i}");
            assert_eq!(decision.updates, updates(&[("c", own)]), "case {i}");
            assert_eq!(
                v.pool().container("c").map(|e| e.kind),
                Some(kinds.1),
                "case {i}"
            );
            v.mark_applied(&decision.updates);
            // Unchanged: still re-pins itself, so the update cannot unpin it.
            let again = v.update_container(&info);
            assert_eq!(again.kinds, Some((kinds.1, kinds.1)), "case {i}");
            assert_eq!(again.updates, updates(&[("c", own)]), "case {i}");
        }
        let unknown = view(true).update_container(&container("unknown", POD_A, &[], Some(512)));
        assert_eq!((unknown.kinds, unknown.updates), (None, Vec::new()));
    }

    #[test]
    fn an_update_without_shares_keeps_the_request_the_view_knows() {
        let mut v = view(true);
        v.apply_prepared(1, claim(CLAIM_1, "2-3", POD_A))
            .expect("claim");
        let info = container("m", POD_A, &[&env(CLAIM_1, "2-3")], Some(512));
        v.create(&info).decided().expect("mixed");
        let decision = v.update_container(&ContainerInfo {
            cpu_shares: None,
            ..info
        });
        assert_eq!(
            decision.kinds,
            Some((ContainerKind::Mixed, ContainerKind::Mixed))
        );
        assert_eq!(decision.updates, updates(&[("m", "1-7")]));
    }

    #[test]
    fn later_pool_changes_follow_the_kind_a_resize_gave() {
        // Two claim containers resized in opposite directions; a later claim
        // shrinks the one that became mixed and leaves the one that became
        // exclusive alone, and its unprepare grows only the mixed one back.
        let mut v = view(true);
        v.apply_prepared(1, claim(CLAIM_1, "2", POD_A))
            .expect("claim 1");
        v.apply_prepared(2, claim(CLAIM_2, "3", POD_B))
            .expect("claim 2");
        let mut to_mixed = container("m", POD_A, &[&env(CLAIM_1, "2")], Some(2));
        let mut to_excl = container("x", POD_B, &[&env(CLAIM_2, "3")], Some(512));
        let shared = container("s", POD_B, &[], Some(512));
        for info in [&to_mixed, &to_excl, &shared] {
            let d = v.create(info).decided().expect("created");
            v.mark_applied(&[Update::cpuset(info.id.clone(), d.cpuset)]);
            v.mark_applied(&d.updates);
        }
        to_mixed.cpu_shares = Some(256);
        to_excl.cpu_shares = Some(2);
        for info in [&to_mixed, &to_excl] {
            let d = v.update_container(info);
            v.mark_applied(&d.updates);
        }
        assert_eq!(
            v.pool().container("m").map(|e| e.kind),
            Some(ContainerKind::Mixed)
        );
        assert_eq!(
            v.pool().container("x").map(|e| e.kind),
            Some(ContainerKind::Exclusive)
        );

        let later = "c3c3c3c3-0000-4000-8000-000000000003";
        let shrink = v
            .apply_prepared(3, claim(later, "7", POD_B))
            .expect("later claim");
        assert_eq!(shrink, updates(&[("m", "1-2,4-6"), ("s", "1,4-6")]));
        v.mark_applied(&shrink);
        let grow = v.apply_unprepared(4, later).expect("unprepare");
        assert_eq!(grow, updates(&[("m", "1-2,4-7"), ("s", "1,4-7")]));
    }

    #[test]
    fn a_kind_change_moves_memory_with_the_cpus_under_align_memory() {
        let topo = two_numa_nodes();
        let mut v = NodeView::new(
            set("0-7"),
            set(""),
            true,
            Some(NumaMap::from_topology(&topo)),
        );
        v.apply_prepared(1, claim(CLAIM_1, "6", POD_A))
            .expect("claim");
        let mut info = container("c", POD_A, &[&env(CLAIM_1, "6")], None);
        let created = v.create(&info).decided().expect("exclusive");
        assert_eq!(created.mems, Some(set("1")));
        v.mark_applied(&[Update::cpuset("c", created.cpuset)]);
        // (shares updated to, own cpuset, mems sent): only a kind change
        // moves memory, to the nodes of every CPU the container now runs on.
        let steps = [
            (512, "0-7", Some(set("0-1"))),
            (100, "0-7", None),
            (2, "6", Some(set("1"))),
            (2, "6", None),
        ];
        for (shares, own, mems) in steps {
            info.cpu_shares = Some(shares);
            let d = v.update_container(&info);
            assert_eq!(d.updates, updates(&[("c", own)]), "shares {shares}");
            assert_eq!(d.mems, mems, "shares {shares}");
            v.mark_applied(&d.updates);
        }
        let shared = container("s", POD_A, &[], Some(2));
        v.create(&shared).decided().expect("shared");
        let d = v.update_container(&ContainerInfo {
            cpu_shares: Some(512),
            ..shared
        });
        assert_eq!(
            d.mems, None,
            "a shared container's memory is never confined"
        );
    }

    #[test]
    fn stop_keeps_the_reservation_and_restart_gets_the_same_cpus() {
        let mut v = view(false);
        v.apply_prepared(1, claim(CLAIM_1, "4-5", POD_A))
            .expect("claim");
        let mut first = container("first", POD_A, &[&env(CLAIM_1, "4-5")], None);
        first.name = "app".into();
        v.create(&first).decided().expect("first");
        assert!(v.stop_container("first").is_empty());
        assert_eq!(v.pool().shared(), set("1-3,6-7"), "reservation kept");
        let mut second = first.clone();
        second.id = "second".into();
        assert_eq!(
            v.create(&second).decided().expect("restart").cpuset,
            set("4-5")
        );
    }
}
