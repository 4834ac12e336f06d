//! The node playing the scheduler and kubelet for claims: allocate, prepare,
//! unprepare, and what dra-plugin stored and wrote for them.

use super::claim_objects::{allocated_claim_on, allocated_individual_claim, first_available_claim};
use super::pods::{PodIdentity, RunningPod};
use super::read_back::cdi_spec_cpus;
use super::{Node, NodeError, DRIVER_NAME, GROUPED_DEVICE, NAMESPACE};
use crate::cri::spec::ContainerSpec;
use crate::kubelet_dra::calls::cdi_ids_for_container;
use crate::kubelet_dra::{Claim, KubeletDra, KubeletDraError};
use k8s_openapi::api::resource::v1::ResourceClaim;
use serde_json::Value;
use shared_state::CpuSet;

/// A claim the scheduler allocated and the kubelet stand-in prepared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedClaim {
    pub claim: Claim,
    /// The qualified CDI device of the claim, for CreateContainer.
    pub cdi_device: String,
    /// The CPUs the claim's CDI spec gives it.
    pub cpus: CpuSet,
}

impl Node {
    fn kubelet(&self) -> Result<&KubeletDra, NodeError> {
        self.kubelet.as_ref().ok_or(NodeError::NotRegistered)
    }

    /// Opens the device-health stream a kubelet of `release` opens, as the
    /// registered kubelet stand-in.
    pub async fn watch_health(
        &self,
        release: crate::kubelet_dra::health::KubeletRelease,
    ) -> Result<Option<crate::kubelet_dra::health::HealthWatch>, NodeError> {
        Ok(self.kubelet()?.watch_health(release).await?)
    }

    /// Plays the scheduler: a ResourceClaim `name` of `cpus` CPUs from this
    /// node's grouped device, allocated and reserved for `pod`.
    pub fn allocate_claim(
        &self,
        name: &str,
        cpus: u32,
        pod: &PodIdentity,
    ) -> Result<Claim, NodeError> {
        // Plays the scheduler on what is published: the grouped device with
        // consumed capacity where there is one, else the first free
        // individual devices.
        let published: Vec<String> = self
            .published_slices()
            .iter()
            .filter_map(|s| s.pointer("/spec/devices").and_then(Value::as_array))
            .flatten()
            .filter_map(|d| d.get("name").and_then(Value::as_str).map(str::to_string))
            .collect();
        if published.is_empty() || published.iter().any(|d| d == GROUPED_DEVICE) {
            return self.allocate_claim_on(name, GROUPED_DEVICE, cpus, pod);
        }
        let taken = self.api.allocated_devices();
        let mut free: Vec<String> = published
            .into_iter()
            .filter(|d| !taken.contains(d))
            .collect();
        free.sort();
        free.truncate(usize::try_from(cpus).unwrap_or(usize::MAX));
        let object = allocated_individual_claim(name, &self.options.node_name, &free, pod);
        self.store_claim(name, object)
    }

    /// Plays the scheduler: a ResourceClaim `name` of `cpus` CPUs from
    /// this node's grouped device `device`, allocated and reserved for `pod`.
    pub fn allocate_claim_on(
        &self,
        name: &str,
        device: &str,
        cpus: u32,
        pod: &PodIdentity,
    ) -> Result<Claim, NodeError> {
        let object = allocated_claim_on(
            name,
            &self.options.node_name,
            device,
            cpus,
            &pod.name,
            &pod.uid,
        );
        self.store_claim(name, object)
    }

    /// [`Node::allocate_claim_on`], with one opaque config of this driver
    /// from the claim for all its requests, whose parameters are
    /// `parameters` (as an external scheduler or the claim's author writes
    /// them: a cpuset, a tuning, both, or something malformed).
    pub fn allocate_claim_with_parameters(
        &self,
        name: &str,
        device: &str,
        cpus: u32,
        pod: &PodIdentity,
        parameters: Value,
    ) -> Result<Claim, NodeError> {
        let object = allocated_claim_on(
            name,
            &self.options.node_name,
            device,
            cpus,
            &pod.name,
            &pod.uid,
        )
        .and_then(|object| {
            let mut value = serde_json::to_value(object)?;
            if let Some(devices) = value
                .pointer_mut("/status/allocation/devices")
                .and_then(Value::as_object_mut)
            {
                devices.insert(
                    "config".into(),
                    serde_json::json!([{
                        "source": "FromClaim",
                        "opaque": {"driver": DRIVER_NAME, "parameters": parameters}
                    }]),
                );
            }
            serde_json::from_value(value)
        });
        self.store_claim(name, object)
    }

    /// Stores a claim the scheduler allocated, as the API server holds it.
    fn store_claim(
        &self,
        name: &str,
        object: Result<ResourceClaim, serde_json::Error>,
    ) -> Result<Claim, NodeError> {
        let object = object.map_err(|e| NodeError::ClaimObject {
            name: name.to_string(),
            reason: e.to_string(),
        })?;
        let stored = self.api.insert_claim(object)?;
        let uid = stored.metadata.uid.ok_or_else(|| NodeError::ClaimObject {
            name: name.to_string(),
            reason: "stored without a uid".into(),
        })?;
        Ok(Claim {
            namespace: NAMESPACE.to_string(),
            name: name.to_string(),
            uid,
        })
    }

    /// Plays kubelet: NodePrepareResources for one claim, used by a
    /// container that names no request of it.
    pub async fn prepare(&self, claim: &Claim) -> Result<PreparedClaim, NodeError> {
        self.prepare_for_request(claim, "").await
    }

    /// Plays kubelet: NodePrepareResources for one claim, used by a
    /// container whose `resources.claims[].request` is `request` (empty:
    /// none). The CDI device is the one kubelet would give that container.
    pub async fn prepare_for_request(
        &self,
        claim: &Claim,
        request: &str,
    ) -> Result<PreparedClaim, NodeError> {
        let answers = self.kubelet()?.prepare(std::slice::from_ref(claim)).await?;
        let outcome = answers
            .get(&claim.uid)
            .ok_or_else(|| KubeletDraError::MissingClaim(claim.uid.clone()))?;
        if !outcome.error.is_empty() {
            return Err(NodeError::Prepare {
                claim: format!("{}/{} ({})", claim.namespace, claim.name, claim.uid),
                error: outcome.error.clone(),
            });
        }
        let cdi_device = cdi_ids_for_container(&outcome.devices, request)
            .into_iter()
            .next()
            .ok_or_else(|| NodeError::Prepare {
                claim: claim.uid.clone(),
                error: format!(
                    "kubelet gives a container naming request {request:?} no CDI device of {outcome:?}"
                ),
            })?;
        let cpus = self
            .claim_cpus(&claim.uid)
            .ok_or_else(|| NodeError::Prepare {
                claim: claim.uid.clone(),
                error: format!(
                    "prepared but no CDI spec in {} gives it CPUs",
                    self.layout.cdi_dir.display()
                ),
            })?;
        Ok(PreparedClaim {
            claim: claim.clone(),
            cdi_device,
            cpus,
        })
    }

    /// Plays the scheduler for a claim with `firstAvailable` subrequests (see
    /// [`first_available_claim`]), allocated from its second choice.
    pub fn allocate_first_available_claim(
        &self,
        name: &str,
        cpus: u32,
        pod: &PodIdentity,
    ) -> Result<Claim, NodeError> {
        let object = first_available_claim(name, &self.options.node_name, cpus, pod);
        self.store_claim(name, object)
    }

    /// Scheduler then kubelet: allocate and prepare a claim of `cpus` CPUs.
    pub async fn create_claim(
        &self,
        name: &str,
        cpus: u32,
        pod: &PodIdentity,
    ) -> Result<PreparedClaim, NodeError> {
        let claim = self.allocate_claim(name, cpus, pod)?;
        self.prepare(&claim).await
    }

    /// Scheduler then kubelet: a claim of `cpus` CPUs from grouped device
    /// `device`.
    pub async fn create_claim_on(
        &self,
        name: &str,
        device: &str,
        cpus: u32,
        pod: &PodIdentity,
    ) -> Result<PreparedClaim, NodeError> {
        let claim = self.allocate_claim_on(name, device, cpus, pod)?;
        self.prepare(&claim).await
    }

    /// Scheduler and kubelet for pod `name`, whose one container `app` names
    /// a fresh claim `<name>-cpu` of `cpus` CPUs (from grouped device
    /// `device`, or where [`Node::allocate_claim`] finds them) and requests
    /// `request_milli`.
    pub async fn start_claim_pod(
        &mut self,
        name: &str,
        device: Option<&str>,
        cpus: u32,
        request_milli: Option<i64>,
    ) -> Result<(PodIdentity, PreparedClaim, RunningPod), NodeError> {
        let pod = PodIdentity::new(name);
        let claim_name = format!("{name}-cpu");
        let claim = match device {
            Some(device) => {
                self.create_claim_on(&claim_name, device, cpus, &pod)
                    .await?
            }
            None => self.create_claim(&claim_name, cpus, &pod).await?,
        };
        let spec = ContainerSpec::sleeper("app")
            .with_cdi_device(&claim.cdi_device)
            .with_cpu(request_milli, None);
        let running = self.start_pod(&pod, &[spec]).await?;
        Ok((pod, claim, running))
    }

    /// Kubelet for pod `pod` of one container `spec` that uses the prepared
    /// claim: the running pod and the container's id, once the container
    /// runs on the claim's CPUs (an exclusive container).
    pub async fn start_claim_container(
        &mut self,
        pod: &PodIdentity,
        claim: &PreparedClaim,
        spec: ContainerSpec,
    ) -> Result<(RunningPod, String), NodeError> {
        let spec = spec.with_cdi_device(&claim.cdi_device);
        let name = spec.name.clone();
        let running = self.start_pod(pod, &[spec]).await?;
        let id = running.id(&name).to_string();
        self.wait_cpus(&id, &claim.cpus).await?;
        Ok((running, id))
    }

    /// The claims dra-plugin's store holds, from the first event (the
    /// snapshot) of a coordination Watch.
    pub async fn stored_claims(
        &self,
    ) -> Result<Vec<dra_cpu_proto::coordination::v1::Claim>, NodeError> {
        use dra_cpu_proto::coordination::v1 as coord;
        let failed =
            |what: &str, e: &dyn std::fmt::Display| NodeError::Coordination(format!("{what}: {e}"));
        let channel = dra_cpu_transport::connect_unix(&self.layout().coordination_socket())
            .await
            .map_err(|e| failed("connecting", &e))?;
        let mut client = coord::coordination_client::CoordinationClient::new(channel);
        let mut stream = client
            .watch(coord::WatchRequest {
                from_revision: 0,
                subscriber: "test-node".into(),
            })
            .await
            .map_err(|e| failed("Watch", &e))?
            .into_inner();
        match stream
            .message()
            .await
            .map_err(|e| failed("first event", &e))?
            .and_then(|e| e.event)
        {
            Some(coord::watch_event::Event::Snapshot(s)) => Ok(s.claims),
            other => Err(NodeError::Coordination(format!(
                "the first event is not a snapshot: {other:?}"
            ))),
        }
    }

    /// Plays kubelet: NodeUnprepareResources for one claim.
    pub async fn unprepare(&self, claim: &Claim) -> Result<(), NodeError> {
        let answers = self
            .kubelet()?
            .unprepare(std::slice::from_ref(claim))
            .await?;
        match answers.get(&claim.uid) {
            Some(error) if error.is_empty() => Ok(()),
            Some(error) => Err(NodeError::Unprepare {
                claim: claim.uid.clone(),
                error: error.clone(),
            }),
            None => Err(KubeletDraError::MissingClaim(claim.uid.clone()).into()),
        }
    }

    /// The CPUs this node's CDI specs give claim `claim_uid`.
    pub fn claim_cpus(&self, claim_uid: &str) -> Option<CpuSet> {
        let entries = std::fs::read_dir(&self.layout.cdi_dir).ok()?;
        entries
            .filter_map(Result::ok)
            .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
            .filter_map(|e| std::fs::read_to_string(e.path()).ok())
            .filter_map(|text| serde_json::from_str::<Value>(&text).ok())
            .find_map(|spec| cdi_spec_cpus(&spec, claim_uid))
    }
}
