//! Claim validation: this driver's allocation results taken out of a
//! ResourceClaim read from the API server and checked against what kubelet
//! asked for (UID, node, pool, devices, consumed capacity, consumers).

use super::{ClaimRef, ParsedClaim, PrepareError, POD_CLAIM_NAME_ANNOTATION};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimStatus};
use shared_state::assignment::CPU_CAPACITY;
use shared_state::claim_env::is_claim_uid;
use shared_state::AllocatedDevice;

/// Upper bound on this driver's results in one claim: Kubernetes allows 32
/// per claim; more means a malformed object, not a larger workload.
pub const MAX_DEVICES_PER_CLAIM: usize = 32;

/// Check `claim` (as read from the API server) against what kubelet asked for
/// and take out this driver's results for this node.
pub fn parse_claim(
    requested: &ClaimRef,
    claim: &ResourceClaim,
    driver: &str,
    node: &str,
) -> Result<ParsedClaim, PrepareError> {
    let name = requested.to_string();
    if !is_claim_uid(&requested.uid) {
        return Err(PrepareError::BadClaimUid {
            claim: name,
            uid: requested.uid.clone(),
        });
    }
    let found = claim.metadata.uid.clone().unwrap_or_default();
    if found != requested.uid {
        return Err(PrepareError::UidMismatch {
            claim: name,
            requested: requested.uid.clone(),
            found,
        });
    }
    let status = claim.status.as_ref();
    let results = status
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.as_ref())
        .ok_or_else(|| PrepareError::NotAllocated {
            claim: name.clone(),
        })?;
    let ours: Vec<_> = results.iter().filter(|r| r.driver == driver).collect();
    if ours.is_empty() {
        return Err(PrepareError::NotAllocatedToDriver {
            claim: name,
            driver: driver.to_string(),
        });
    }
    if ours.len() > MAX_DEVICES_PER_CLAIM {
        return Err(PrepareError::TooManyDevices {
            claim: name,
            devices: ours.len(),
            limit: MAX_DEVICES_PER_CLAIM,
        });
    }
    let mut devices = Vec::with_capacity(ours.len());
    for result in ours {
        if result.pool != node {
            return Err(PrepareError::NotThisNode {
                claim: name,
                request: result.request.clone(),
                pool: result.pool.clone(),
                node: node.to_string(),
            });
        }
        // The scheduler counts no device or capacity for an admin-access
        // result, so CPUs given to it would be handed out again.
        if result.admin_access == Some(true) {
            return Err(PrepareError::AdminAccess {
                claim: name,
                request: result.request.clone(),
                device: result.device.clone(),
            });
        }
        let consumed_cpus = match result
            .consumed_capacity
            .as_ref()
            .and_then(|c| c.get(CPU_CAPACITY))
        {
            None => None,
            Some(quantity) => {
                Some(
                    whole_cpus(&quantity.0).ok_or_else(|| PrepareError::CapacityNotWhole {
                        claim: name.clone(),
                        device: result.device.clone(),
                        quantity: quantity.0.clone(),
                    })?,
                )
            }
        };
        devices.push(AllocatedDevice {
            request: result.request.clone(),
            pool: result.pool.clone(),
            device: result.device.clone(),
            consumed_cpus,
            share_id: result.share_id.clone(),
        });
    }
    let consumer_pods = reserved_pods(status);
    if consumer_pods.is_empty() {
        let reserved_for = status
            .and_then(|s| s.reserved_for.as_ref())
            .map(|refs| {
                refs.iter()
                    .map(|r| match r.api_group.as_deref().filter(|g| !g.is_empty()) {
                        Some(group) => format!("{}.{group}/{}", r.resource, r.name),
                        None => format!("{}/{}", r.resource, r.name),
                    })
                    .collect()
            })
            .unwrap_or_default();
        return Err(PrepareError::NoConsumerPod {
            claim: name,
            reserved_for,
        });
    }
    let pod_claim_name = claim
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(POD_CLAIM_NAME_ANNOTATION))
        .filter(|n| !n.is_empty())
        .cloned();
    Ok(ParsedClaim {
        devices,
        consumer_pods,
        pod_claim_name,
    })
}

/// The UIDs of the pods a claim's `status.reservedFor` names (entries of
/// other resources, such as a workload controller's, are not pods).
pub fn reserved_pods(status: Option<&ResourceClaimStatus>) -> Vec<String> {
    status
        .and_then(|s| s.reserved_for.as_ref())
        .map(|refs| {
            refs.iter()
                .filter(|r| r.resource == "pods" && r.api_group.as_deref().unwrap_or("").is_empty())
                .map(|r| r.uid.clone())
                .filter(|uid| !uid.is_empty())
                .collect()
        })
        .unwrap_or_default()
}

/// A Kubernetes quantity that is a whole, positive number of CPUs, in any
/// form the API server accepts or writes back: `4`, `4000m`, `4.0`, `+4`,
/// `1k` (the server's text for 1000), `2Ki`, `1e3`. `1.5`, `500m`, `0` and
/// `-2` are not.
pub fn whole_cpus(quantity: &str) -> Option<u32> {
    let value = crate::quantity::whole_value(quantity)?;
    if value == 0 {
        return None;
    }
    u32::try_from(value).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prepare::tests::{claim_ref, POD, UID_A, UID_B};
    use k8s_openapi::api::resource::v1::{
        AllocationResult, DeviceAllocationResult, DeviceRequestAllocationResult,
        ResourceClaimConsumerReference, ResourceClaimStatus,
    };
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    /// (driver, pool, device, consumed capacity)
    type ResultSpec<'a> = (&'a str, &'a str, &'a str, Option<&'a str>);

    /// The allocation results of a claim made by [`claim`] with results.
    fn results_mut(c: &mut ResourceClaim) -> &mut Vec<DeviceRequestAllocationResult> {
        c.status
            .as_mut()
            .and_then(|s| s.allocation.as_mut())
            .and_then(|a| a.devices.as_mut())
            .and_then(|d| d.results.as_mut())
            .expect("a claim with allocation results")
    }

    fn claim(uid: &str, results: Option<&[ResultSpec]>, pods: &[&str]) -> ResourceClaim {
        let results = results.map(|rs| {
            rs.iter()
                .enumerate()
                .map(
                    |(i, (driver, pool, device, cap))| DeviceRequestAllocationResult {
                        driver: driver.to_string(),
                        pool: pool.to_string(),
                        device: device.to_string(),
                        request: format!("req{i}"),
                        consumed_capacity: cap
                            .map(|q| [(CPU_CAPACITY.to_string(), Quantity(q.to_string()))].into()),
                        ..Default::default()
                    },
                )
                .collect()
        });
        ResourceClaim {
            metadata: ObjectMeta {
                name: Some("c".into()),
                namespace: Some("ns".into()),
                uid: Some(uid.into()),
                ..Default::default()
            },
            status: Some(ResourceClaimStatus {
                allocation: results.map(|results| AllocationResult {
                    devices: Some(DeviceAllocationResult {
                        results: Some(results),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                reserved_for: Some(
                    pods.iter()
                        .map(|p| ResourceClaimConsumerReference {
                            resource: "pods".into(),
                            name: "pod".into(),
                            uid: p.to_string(),
                            api_group: None,
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn whole_cpus_table() {
        let cases = [
            ("4", Some(4)),
            ("+4", Some(4)),
            ("4000m", Some(4)),
            ("4.0", Some(4)),
            ("4.", Some(4)),
            ("1.5", None),
            ("500m", None),
            ("0", None),
            ("0m", None),
            ("-2", None),
            ("1k", Some(1000)),
            ("2k", Some(2000)),
            ("2Ki", Some(2048)),
            ("1e3", Some(1000)),
            ("", None),
            (".0", None),
            ("99999999999", None),
        ];
        for (q, want) in cases {
            assert_eq!(whole_cpus(q), want, "{q:?}");
        }
    }

    #[test]
    fn parse_claim_errors_say_what_is_wrong() {
        let node = "node-a";
        let ok: &[ResultSpec] = &[("dra.cpu", node, "cpudevnuma000", Some("2"))];
        struct Case<'a> {
            name: &'a str,
            requested: &'a str,
            claim: ResourceClaim,
            want: &'a str,
        }
        let cases = [
            Case {
                name: "bad uid",
                requested: "NOT A UID",
                claim: claim(UID_A, Some(ok), &[POD]),
                want: "is not a Kubernetes UID",
            },
            Case {
                name: "replaced claim",
                requested: UID_B,
                claim: claim(UID_A, Some(ok), &[POD]),
                want: &format!("the API server has uid {UID_A}, kubelet asked for {UID_B}"),
            },
            Case {
                name: "not allocated",
                requested: UID_A,
                claim: claim(UID_A, None, &[POD]),
                want: "is not allocated",
            },
            Case {
                name: "other driver",
                requested: UID_A,
                claim: claim(
                    UID_A,
                    Some(&[("gpu.example.com", node, "gpu0", None)]),
                    &[POD],
                ),
                want: "has no allocation result for driver dra.cpu",
            },
            Case {
                name: "other node",
                requested: UID_A,
                claim: claim(
                    UID_A,
                    Some(&[("dra.cpu", "node-b", "cpudevnuma000", Some("2"))]),
                    &[POD],
                ),
                want: "is allocated from pool node-b, not from this node node-a",
            },
            Case {
                name: "fractional capacity",
                requested: UID_A,
                claim: claim(
                    UID_A,
                    Some(&[("dra.cpu", node, "cpudevnuma000", Some("1500m"))]),
                    &[POD],
                ),
                want:
                    "consumedCapacity dra.cpu/cpu \"1500m\" is not a whole positive number of CPUs",
            },
            Case {
                name: "zero capacity",
                requested: UID_A,
                claim: claim(
                    UID_A,
                    Some(&[("dra.cpu", node, "cpudevnuma000", Some("0"))]),
                    &[POD],
                ),
                want: "\"0\" is not a whole positive number",
            },
            Case {
                name: "admin access",
                requested: UID_A,
                claim: {
                    let mut c = claim(UID_A, Some(ok), &[POD]);
                    results_mut(&mut c)[0].admin_access = Some(true);
                    c
                },
                want: "request req0 asks admin access to device cpudevnuma000",
            },
            Case {
                name: "no pod",
                requested: UID_A,
                claim: claim(UID_A, Some(ok), &[]),
                want: "is not reserved for any pod",
            },
            Case {
                name: "reserved for a PodGroup only",
                requested: UID_A,
                claim: {
                    let mut c = claim(UID_A, Some(ok), &[]);
                    if let Some(status) = c.status.as_mut() {
                        status.reserved_for = Some(vec![ResourceClaimConsumerReference {
                            resource: "podgroups".into(),
                            name: "training".into(),
                            uid: "group-uid".into(),
                            api_group: Some("scheduling.k8s.io".into()),
                        }]);
                    }
                    c
                },
                want: "is not reserved for any pod (reserved for podgroups.scheduling.k8s.io/training): exclusive CPUs go to the one pod",
            },
        ];
        for case in cases {
            let requested = claim_ref(case.requested);
            match parse_claim(&requested, &case.claim, "dra.cpu", node) {
                Ok(p) => panic!("{}: parsed {p:?}", case.name),
                Err(e) => assert!(e.to_string().contains(case.want), "{}: {e}", case.name),
            }
        }
    }

    #[test]
    fn parse_claim_takes_only_our_results() {
        let c = claim(
            UID_A,
            Some(&[
                ("gpu.example.com", "node-a", "gpu0", None),
                ("dra.cpu", "node-a", "cpudevnuma001", Some("3")),
            ]),
            &[POD],
        );
        // A grouped device's share (consumable capacity) keeps its ID.
        let mut c = c;
        results_mut(&mut c)[1].share_id = Some("4f1e2d3c-0000-4000-8000-000000000001".into());
        let parsed = parse_claim(&claim_ref(UID_A), &c, "dra.cpu", "node-a").expect("parses");
        assert_eq!(
            parsed.devices,
            vec![AllocatedDevice {
                request: "req1".into(),
                pool: "node-a".into(),
                device: "cpudevnuma001".into(),
                consumed_cpus: Some(3),
                share_id: Some("4f1e2d3c-0000-4000-8000-000000000001".into()),
            }]
        );
        assert_eq!(parsed.consumer_pods, vec![POD.to_string()]);
    }
}
