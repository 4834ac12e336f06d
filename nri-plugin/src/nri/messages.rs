//! The NRI messages nri-plugin reads and writes: a container's
//! [`ContainerInfo`] from the runtime's `Container` and `PodSandbox`, and
//! the replies and updates built from the view's decisions.

use crate::metrics::upstream::CpuAllocationMode;
use dra_cpu_nri::plugin::ContainerCreation;
use dra_cpu_proto::nri::api::{
    self, Container, ContainerAdjustment, ContainerUpdate, LinuxContainerAdjustment,
    LinuxContainerUpdate, LinuxResources, PodSandbox,
};
use shared_state::claim_env::parse_claim_env;
use shared_state::pool::Update;
use shared_state::CpuSet;

use crate::view::planning::{CreateDecision, UpdateDecision};
use crate::view::ContainerInfo;

fn cpu_resources(cpus: &CpuSet, mems: Option<&CpuSet>) -> LinuxResources {
    let mut cpu = api::LinuxCPU::new();
    cpu.cpus = cpus.to_cpulist();
    if let Some(mems) = mems {
        cpu.mems = mems.to_cpulist();
    }
    let mut resources = LinuxResources::new();
    resources.cpu = Some(cpu).into();
    resources
}

/// NRI updates that set the cpuset, and turn the CFS quota off where the
/// update says so (nothing else of the container's resources). A container
/// may exit while its update is in flight; that must not fail the event the
/// update rides on.
pub fn to_nri_updates(updates: &[Update]) -> Vec<ContainerUpdate> {
    // Most updates of one reply carry the same shared pool: render each
    // distinct cpuset once.
    let mut rendered: Vec<(&CpuSet, LinuxResources)> = Vec::new();
    updates
        .iter()
        .map(|update| {
            let cpus = &update.cpuset;
            let mut resources = match rendered.iter().find(|(seen, _)| *seen == cpus) {
                Some((_, r)) => r.clone(),
                None => {
                    let r = cpu_resources(cpus, None);
                    rendered.push((cpus, r.clone()));
                    r
                }
            };
            if update.cfs_quota_off {
                if let Some(cpu) = resources.cpu.as_mut() {
                    cpu.quota = Some(no_quota()).into();
                }
            }
            let mut linux = LinuxContainerUpdate::new();
            linux.resources = Some(resources).into();
            let mut u = ContainerUpdate::new();
            u.container_id = update.container_id.clone();
            u.linux = Some(linux).into();
            u.ignore_failure = true;
            u
        })
        .collect()
}

/// The UpdateContainer reply: the updates, with the updated container's
/// memory nodes when its kind change moved them.
pub fn update_reply(container_id: &str, decision: &UpdateDecision) -> Vec<ContainerUpdate> {
    let mut reply = to_nri_updates(&decision.updates);
    if let Some(mems) = &decision.mems {
        for u in reply.iter_mut().filter(|u| u.container_id == container_id) {
            if let Some(cpu) = u
                .linux
                .as_mut()
                .and_then(|l| l.resources.as_mut())
                .and_then(|r| r.cpu.as_mut())
            {
                cpu.mems = mems.to_cpulist();
            }
        }
    }
    reply
}

fn no_quota() -> api::OptionalInt64 {
    let mut quota = api::OptionalInt64::new();
    quota.value = NO_CFS_QUOTA;
    quota
}

/// The CFS quota that means "none" to the runtime: runc writes `max` to
/// cgroup v2's `cpu.max` and -1 to v1's `cpu.cfs_quota_us`.
pub const NO_CFS_QUOTA: i64 = -1;

/// The CreateContainer reply of a decision.
pub fn creation_reply(decision: &CreateDecision) -> ContainerCreation {
    let mut linux = LinuxContainerAdjustment::new();
    let mut resources = cpu_resources(&decision.cpuset, decision.mems.as_ref());
    if decision.cfs_quota_off {
        if let Some(cpu) = resources.cpu.as_mut() {
            cpu.quota = Some(no_quota()).into();
        }
    }
    linux.resources = Some(resources).into();
    let mut adjust = ContainerAdjustment::new();
    adjust.linux = Some(linux).into();
    ContainerCreation {
        adjust: Some(adjust),
        update: to_nri_updates(&decision.updates),
        evict: Vec::new(),
    }
}

fn shares_of(resources: Option<&LinuxResources>) -> Option<u64> {
    resources
        .and_then(|r| r.cpu.as_ref())
        .and_then(|c| c.shares.as_ref())
        .map(|s| s.value)
}

fn cpus_of(resources: Option<&LinuxResources>) -> CpuSet {
    resources
        .and_then(|r| r.cpu.as_ref())
        .and_then(|c| CpuSet::parse_cpulist(&c.cpus).ok())
        .unwrap_or_default()
}

/// The container of an UpdateContainer with the CPU request it is being
/// updated to. The runtime builds the request's resources from CRI
/// `UpdateContainerResources`, where an unset `cpu_shares` is 0 (proto3) and
/// means "leave as is" (containerd's `WithResources` skips it); so only a
/// non-zero value is a new request. Without one, `cpu_shares` is `None` and
/// the view keeps the request it last saw for the container.
pub fn update_info(
    pod: &PodSandbox,
    container: &Container,
    requested: Option<&LinuxResources>,
) -> ContainerInfo {
    ContainerInfo {
        cpu_shares: shares_of(requested).filter(|s| *s > 0),
        ..container_info(pod, container)
    }
}

/// The plain data the view needs from NRI's messages.
pub fn container_info(pod: &PodSandbox, container: &Container) -> ContainerInfo {
    let resources = container.linux.as_ref().and_then(|l| l.resources.as_ref());
    ContainerInfo {
        id: container.id.clone(),
        name: container.name.clone(),
        pod_uid: pod.uid.clone(),
        pod_name: pod.name.clone(),
        pod_namespace: pod.namespace.clone(),
        env: container.env.clone(),
        cpu_shares: shares_of(resources),
        cpus: cpus_of(resources),
        stopped: container.state.value() == api::ContainerState::CONTAINER_STOPPED as i32,
    }
}

/// Upstream's `cpu_allocation_mode` of a container: by the claims its
/// environment names, unknown when that environment does not parse.
pub(crate) fn allocation_mode(container: &Container) -> CpuAllocationMode {
    CpuAllocationMode::of_claim_count(parse_claim_env(&container.env).ok().map(|c| c.len()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::set;
    use dra_cpu_proto::nri::api;
    use shared_state::pool::arithmetic::ContainerKind;

    #[test]
    fn upstream_allocation_mode_follows_the_claim_env() {
        let claim = "a1a1a1a1-0000-4000-8000-000000000001";
        let cases: [(Vec<String>, CpuAllocationMode); 3] = [
            (vec!["PATH=/bin".into()], CpuAllocationMode::Shared),
            (
                vec![shared_state::claim_env::cdi_env_var(claim, &set("2-3"))],
                CpuAllocationMode::Exclusive,
            ),
            (
                vec![format!("DRA_CPUSET_{claim}=not-a-cpulist")],
                CpuAllocationMode::Unknown,
            ),
        ];
        for (env, want) in cases {
            let mut container = Container::new();
            container.env = env.clone();
            assert_eq!(allocation_mode(&container), want, "{env:?}");
        }
    }

    #[test]
    fn update_reply_sets_mems_on_the_updated_container_only() {
        let decision = UpdateDecision {
            kinds: Some((ContainerKind::Exclusive, ContainerKind::Mixed)),
            mems: Some(set("0-1")),
            updates: vec![
                Update::cpuset("a", set("0-5")),
                Update {
                    cfs_quota_off: true,
                    ..Update::cpuset("c", set("0-7"))
                },
            ],
        };
        let reply = update_reply("c", &decision);
        let cpu = |i: usize| {
            reply[i]
                .linux
                .resources
                .cpu
                .clone()
                .into_option()
                .expect("cpu")
        };
        assert_eq!((cpu(0).cpus.as_str(), cpu(0).mems.as_str()), ("0-5", ""));
        assert_eq!((cpu(1).cpus.as_str(), cpu(1).mems.as_str()), ("0-7", "0-1"));
        // The quota is off where the update says so, and only there.
        assert!(cpu(0).quota.is_none());
        assert_eq!(cpu(1).quota.as_ref().map(|q| q.value), Some(NO_CFS_QUOTA));
    }

    #[test]
    fn reply_sets_cpus_mems_and_other_updates() {
        let decision = CreateDecision {
            kind: ContainerKind::Exclusive,
            cpuset: set("2-3"),
            mems: Some(set("0")),
            updates: vec![Update::cpuset("other", set("1,4-7"))],
            claims: vec!["c".into()],
            cfs_quota_off: false,
        };
        let quota_off = creation_reply(&CreateDecision {
            cfs_quota_off: true,
            ..decision.clone()
        });
        let adjusted = quota_off
            .adjust
            .expect("adjust")
            .linux
            .resources
            .cpu
            .clone();
        assert_eq!(
            adjusted
                .into_option()
                .and_then(|c| c.quota.into_option())
                .map(|q| q.value),
            Some(NO_CFS_QUOTA)
        );
        let reply = creation_reply(&decision);
        let adjust = reply.adjust.expect("adjust");
        let cpu = adjust
            .linux
            .resources
            .cpu
            .clone()
            .into_option()
            .expect("cpu");
        assert_eq!((cpu.cpus.as_str(), cpu.mems.as_str()), ("2-3", "0"));
        assert_eq!(reply.update.len(), 1);
        let u = &reply.update[0];
        assert_eq!(u.container_id, "other");
        let cpu = u.linux.resources.cpu.clone().into_option().expect("cpu");
        assert_eq!((cpu.cpus.as_str(), cpu.mems.as_str()), ("1,4-7", ""));
        assert!(cpu.shares.is_none(), "only the cpuset is touched");
        assert!(cpu.quota.is_none(), "only the cpuset is touched");
        assert!(u.ignore_failure);
    }

    #[test]
    fn container_info_reads_shares_cpus_env_and_state() {
        let mut pod = PodSandbox::new();
        pod.uid = "pod-uid".into();
        let mut c = Container::new();
        c.id = "cid".into();
        c.env = vec!["A=1".into()];
        let mut cpu = api::LinuxCPU::new();
        let mut shares = api::OptionalUInt64::new();
        shares.value = 512;
        cpu.shares = Some(shares).into();
        cpu.cpus = "0-1".into();
        let mut res = LinuxResources::new();
        res.cpu = Some(cpu).into();
        let mut linux = api::LinuxContainer::new();
        linux.resources = Some(res).into();
        c.linux = Some(linux).into();
        c.state = api::ContainerState::CONTAINER_STOPPED.into();
        let info = container_info(&pod, &c);
        assert_eq!(info.pod_uid, "pod-uid");
        assert_eq!(info.cpu_shares, Some(512));
        assert_eq!(info.cpus, set("0-1"));
        assert!(info.stopped);
        let bare = container_info(&pod, &Container::new());
        assert_eq!(
            (bare.cpu_shares, bare.cpus.is_empty(), bare.stopped),
            (None, true, false)
        );
    }
}
