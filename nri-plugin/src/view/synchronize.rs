//! Synchronize: rebuild the containers of the view from the runtime's list,
//! so every running container gets its correct cpuset, and find the claims
//! they name that the view has not heard of.

use std::collections::BTreeSet;

use shared_state::pool::Update;

use super::{ContainerInfo, NodeView};

/// The outcome of a Synchronize.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SyncOutcome {
    /// Every container whose cpuset (or CFS quota) must change, sorted by id.
    pub updates: Vec<Update>,
    /// Running containers whose claims did not validate; they are placed on
    /// the shared pool, never on claim CPUs.
    pub demoted: Vec<(String, String)>,
}

impl NodeView {
    /// Rebuild the container view from the runtime's list and return the
    /// updates that put every running container on its correct cpuset.
    /// Claims must already be resolved (see [`super::synchronize_containers`]);
    /// a container whose claims do not validate is placed as shared.
    /// Every container is placed first and the updates are planned once at
    /// the end, so the work grows linearly with the number of containers.
    pub fn synchronize(&mut self, containers: &[ContainerInfo]) -> SyncOutcome {
        let running: Vec<&ContainerInfo> = containers.iter().filter(|c| !c.stopped).collect();
        let keep: BTreeSet<&str> = running.iter().map(|c| c.id.as_str()).collect();
        let known: Vec<String> = self.pool.containers().keys().cloned().collect();
        for id in known {
            if !keep.contains(id.as_str()) {
                self.pool.remove_container(&id);
            }
        }
        let mut demoted = Vec::new();
        // Claim containers first, and among them those running on the CPUs
        // their claims name: a forged copy of a claim's env (refused, so on
        // the shared pool) never takes the claim from the container that
        // has it by sorting earlier, even where the claim is known only
        // from its CDI spec and the first to name it adopts it.
        let mut ordered = running.clone();
        ordered.sort_by_cached_key(|c| {
            let claim_cpus = Self::env_claims(c).ok().map(|refs| {
                refs.iter()
                    .fold(shared_state::CpuSet::new(), |all, r| all.union(&r.cpus))
            });
            (
                c.env.iter().all(|e| !e.starts_with("DRA_CPUSET_")),
                !claim_cpus.is_some_and(|cpus| !cpus.is_empty() && cpus.is_subset(&c.cpus)),
                c.id.clone(),
            )
        });
        for info in ordered {
            let refs = Self::env_claims(info);
            // Unlike at creation, a container refused here keeps what it
            // adopted: sorted first, it is the one running on the claim's
            // CPUs, and a later copy of its env must not take the claim.
            self.adopt_provisional(refs.as_deref().unwrap_or(&[]), &info.pod_uid);
            let admitted = match refs {
                Ok(refs) => self
                    .pool
                    .place(&info.id, &info.pod_uid, &info.name, &refs, info.cpu_shares)
                    .map(|_| ())
                    .map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            if let Err(reason) = admitted {
                demoted.push((info.id.clone(), reason));
                if let Err(err) =
                    self.pool
                        .place(&info.id, &info.pod_uid, &info.name, &[], info.cpu_shares)
                {
                    // Shared pool empty: the container keeps what it has.
                    tracing::warn!(container = %info.id, error = %err, "cannot place container");
                    continue;
                }
            }
            // What the runtime reports is what the container has now. Its
            // quota is taken as its CPU limit set it: one started while
            // nri-plugin was away has it, and the claims that ask for none
            // get their update.
            self.pool
                .mark_applied(&[Update::cpuset(info.id.clone(), info.cpus.clone())]);
        }
        SyncOutcome {
            updates: self.pool.plan_updates(),
            demoted,
        }
    }
}

/// Claim UIDs that containers name but the view does not know, or knows
/// only from a CDI spec (provisional), in order.
pub fn unknown_claims(view: &NodeView, containers: &[ContainerInfo]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for info in containers.iter().filter(|c| !c.stopped) {
        let Ok(refs) = NodeView::env_claims(info) else {
            continue;
        };
        for r in refs {
            // A provisional claim (read from its CDI spec while dra-plugin
            // was away) is asked about too: dra-plugin's answer has what the
            // spec lacks, the claim's pods and its tuning (a running
            // container whose claim asks for an isolated partition gets it
            // here, whether or not the snapshot has arrived yet).
            let known =
                view.pool().claim(&r.claim_uid).is_some() && !view.is_provisional(&r.claim_uid);
            if !known && !out.contains(&r.claim_uid) {
                out.push(r.claim_uid);
            }
        }
    }
    out
}

/// A claim and a pod its record does not name, for a running container of
/// that pod naming the claim with its CPUs: the pod may have been added to
/// the claim's `reservedFor` after the claim's prepare, while no container
/// creation could ask (nri-plugin away). Provisional claims are left to
/// their adoption rule. Each pair once.
pub fn pods_to_ask_for(view: &NodeView, containers: &[ContainerInfo]) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for info in containers.iter().filter(|c| !c.stopped) {
        let Ok(refs) = NodeView::env_claims(info) else {
            continue;
        };
        for r in refs {
            let Some(claim) = view.pool().claim(&r.claim_uid) else {
                continue;
            };
            let ask = !view.is_provisional(&r.claim_uid)
                && claim.cpus == r.cpus
                && !claim.consumer_pods.contains(&info.pod_uid);
            let pair = (r.claim_uid, info.pod_uid.clone());
            if ask && !out.contains(&pair) {
                out.push(pair);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use crate::test_support::*;

    #[test]
    fn synchronize_repairs_every_container_and_demotes_forgeries() {
        let mut v = view(false);
        v.apply_prepared(1, claim(CLAIM_1, "2-3", POD_A))
            .expect("claim");
        let mut owner = container("owner", POD_A, &[&env(CLAIM_1, "2-3")], None);
        owner.cpus = set("0-7"); // created while nri-plugin was down
        let mut shared = container("shared", POD_B, &[], None);
        shared.cpus = set("0-7");
        let mut forger = container("aaa-forger", POD_B, &[&env(CLAIM_1, "2-3")], None);
        forger.cpus = set("0-7");
        let mut right = container("right", POD_B, &[], None);
        right.cpus = set("1,4-7");
        let mut stopped = container("stopped", POD_B, &[], None);
        stopped.stopped = true;
        v.create(&container("gone", POD_B, &[], None))
            .decided()
            .expect("old");

        let out = v.synchronize(&[owner, shared, forger, right, stopped]);
        assert_eq!(
            out.updates,
            updates(&[
                ("aaa-forger", "1,4-7"),
                ("owner", "2-3"),
                ("shared", "1,4-7")
            ])
        );
        assert_eq!(out.demoted.len(), 1);
        assert_eq!(out.demoted[0].0, "aaa-forger");
        assert!(
            out.demoted[0].1.contains("not for pod"),
            "{:?}",
            out.demoted
        );
        assert!(
            v.pool().container("gone").is_none(),
            "gone from the runtime"
        );
        assert!(v.pool().container("stopped").is_none());
        assert_eq!(v.pool().claim_owner(CLAIM_1), Some("owner"));
    }
}
