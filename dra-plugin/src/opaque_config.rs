//! The upstream driver's opaque cpuset config (`api/v1alpha1`,
//! docs/user/opaque-cpuset-overrides.md): an external scheduler writes, in
//! the claim's `status.allocation.devices.config[]`, which CPUs a request
//! gets:
//!
//! ```yaml
//! - source: FromClaim
//!   requests: [cpus]
//!   opaque:
//!     driver: dra.cpu
//!     parameters: {apiVersion: v1alpha1, cpuConfig: {cpuset: "2-5"}}
//! ```
//!
//! Beside `cpuConfig` (or instead of it) the parameters may carry this
//! driver's `tuning` object (`shared_state::tuning::request`): what the
//! claim asks of its CPUs beyond exclusivity. A tuning config may come from
//! the DeviceClass too (a class of low-latency CPUs); the claim's own
//! configs come after the class's, and a knob a later config sets wins.
//!
//! Only configs for this driver are read. Each cpuset config must come from the claim
//! (a DeviceClass config would give every claim of the class the same CPUs),
//! each request gets at most one, and an empty `requests` list applies to
//! every request of the claim. The CPUs are then checked against the node
//! and the other claims before they are used in place of the allocator's
//! choice, in every grouped mode.

use k8s_openapi::api::resource::v1::DeviceAllocationConfiguration;
use serde_json::Value;
use shared_state::tuning::request::{parse_tuning, Tuning, TuningError, TuningRequest};
use shared_state::CpuSet;
use std::collections::BTreeMap;

/// The only parameters `apiVersion` read.
pub const API_VERSION: &str = "v1alpha1";
/// The config source this driver honours.
pub const FROM_CLAIM: &str = "FromClaim";

/// Why an opaque cpuset config was refused. Each message names the request
/// (or the config entry) and the CPUs concerned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OpaqueConfigError {
    #[error("config {index} has source {config_source:?}: only {FROM_CLAIM:?} configs are honoured (a DeviceClass config would give every claim of the class the same CPUs)")]
    NotFromClaim { index: usize, config_source: String },
    #[error("config {index}: unsupported apiVersion {found:?}, want {API_VERSION:?}")]
    ApiVersion { index: usize, found: String },
    #[error("config {index}: {source}")]
    Tuning {
        index: usize,
        #[source]
        source: TuningError,
    },
    #[error("config {index}: tuning applies to all of a claim's CPUs, so it must name every request of this driver or none; it leaves out {missing}")]
    TuningNotForEveryRequest { index: usize, missing: String },
    #[error("config {index}: unknown field {field:?}")]
    UnknownField { index: usize, field: String },
    #[error("config {index}: {reason}")]
    Malformed { index: usize, reason: String },
    #[error("config {index}: cpuConfig.cpuset {value:?} is not a CPU list: {reason}")]
    BadCpuset {
        index: usize,
        value: String,
        reason: String,
    },
    #[error("request {request}: configs {first} and {second} both set its cpuset; exactly one config per request")]
    TwoConfigs {
        request: String,
        first: usize,
        second: usize,
    },
    #[error("request {request}: cpuset {cpus} has {got} CPUs but the request consumed {want}")]
    Size {
        request: String,
        cpus: CpuSet,
        got: usize,
        want: usize,
    },
    #[error("request {request}: cpuset {cpus}: CPUs {offline} are not online")]
    Offline {
        request: String,
        cpus: CpuSet,
        offline: CpuSet,
    },
    #[error("request {request}: cpuset {cpus}: CPUs {reserved} are reserved")]
    Reserved {
        request: String,
        cpus: CpuSet,
        reserved: CpuSet,
    },
    #[error(
        "request {request}: cpuset {cpus}: CPUs {outside} are not in device {device} ({group})"
    )]
    OutsideDevice {
        request: String,
        cpus: CpuSet,
        outside: CpuSet,
        device: String,
        group: CpuSet,
    },
    #[error("request {request}: cpuset {cpus}: CPUs {clash} are already held by {holder}")]
    Taken {
        request: String,
        cpus: CpuSet,
        clash: CpuSet,
        holder: String,
    },
    #[error(
        "request {request}: {devices} devices were allocated; an opaque cpuset needs exactly one"
    )]
    SeveralDevices { request: String, devices: usize },
}

/// One config entry's parameters: the CPUs it sets and the tuning it asks,
/// at least one of them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Parameters {
    cpus: Option<CpuSet>,
    tuning: Option<TuningRequest>,
}

fn parse_parameters(index: usize, parameters: &Value) -> Result<Parameters, OpaqueConfigError> {
    let malformed = |reason: &str| OpaqueConfigError::Malformed {
        index,
        reason: reason.to_string(),
    };
    let object = parameters
        .as_object()
        .ok_or_else(|| malformed("parameters are not an object"))?;
    let version = object.get("apiVersion").and_then(Value::as_str);
    if version != Some(API_VERSION) {
        return Err(OpaqueConfigError::ApiVersion {
            index,
            found: match object.get("apiVersion") {
                Some(Value::String(s)) => s.clone(),
                Some(other) => other.to_string(),
                None => String::new(),
            },
        });
    }
    if let Some(field) = object
        .keys()
        .find(|k| !matches!(k.as_str(), "apiVersion" | "cpuConfig" | "tuning"))
    {
        return Err(OpaqueConfigError::UnknownField {
            index,
            field: field.clone(),
        });
    }
    let tuning = object
        .get("tuning")
        .map(|value| parse_tuning("tuning", value))
        .transpose()
        .map_err(|source| OpaqueConfigError::Tuning { index, source })?;
    let Some(cpu_config) = object.get("cpuConfig") else {
        if tuning.is_none() {
            return Err(malformed("neither cpuConfig nor tuning is set"));
        }
        return Ok(Parameters { cpus: None, tuning });
    };
    let cpu_config = cpu_config
        .as_object()
        .ok_or_else(|| malformed("cpuConfig is not an object"))?;
    if let Some(field) = cpu_config.keys().find(|k| k.as_str() != "cpuset") {
        return Err(OpaqueConfigError::UnknownField {
            index,
            field: format!("cpuConfig.{field}"),
        });
    }
    let value = cpu_config
        .get("cpuset")
        .and_then(Value::as_str)
        .filter(|s| !s.trim().is_empty())
        .ok_or_else(|| malformed("cpuConfig.cpuset is empty or missing"))?;
    let cpus = CpuSet::parse_cpulist(value).map_err(|e| OpaqueConfigError::BadCpuset {
        index,
        value: value.to_string(),
        reason: e.to_string(),
    })?;
    if cpus.is_empty() {
        return Err(malformed("cpuConfig.cpuset is empty or missing"));
    }
    Ok(Parameters {
        cpus: Some(cpus),
        tuning,
    })
}

fn names(entry: &str, request: &str) -> bool {
    entry == request
        || request
            .split_once('/')
            .is_some_and(|(parent, _)| parent == entry)
}

/// The cpuset each request of this driver is given by the claim's configs.
/// `requests` are the `request` names of this driver's results.
pub fn cpusets_by_request(
    configs: &[DeviceAllocationConfiguration],
    driver: &str,
    requests: &[&str],
) -> Result<BTreeMap<String, CpuSet>, OpaqueConfigError> {
    let mut chosen: BTreeMap<String, (usize, CpuSet)> = BTreeMap::new();
    for (index, config) in configs.iter().enumerate() {
        let Some(opaque) = config.opaque.as_ref().filter(|o| o.driver == driver) else {
            continue;
        };
        let Some(cpus) = parse_parameters(index, &opaque.parameters.0)?.cpus else {
            continue;
        };
        if config.source != FROM_CLAIM {
            return Err(OpaqueConfigError::NotFromClaim {
                index,
                config_source: config.source.clone(),
            });
        }
        let listed = config.requests.as_deref().unwrap_or_default();
        for request in requests {
            if !listed.is_empty() && !listed.iter().any(|entry| names(entry, request)) {
                continue;
            }
            if let Some((first, _)) = chosen.get(*request) {
                return Err(OpaqueConfigError::TwoConfigs {
                    request: request.to_string(),
                    first: *first,
                    second: index,
                });
            }
            chosen.insert(request.to_string(), (index, cpus.clone()));
        }
    }
    Ok(chosen
        .into_iter()
        .map(|(request, (_, cpus))| (request, cpus))
        .collect())
}

/// What a configured cpuset is checked against.
/// The tuning a claim asks for: every `tuning` of this driver's configs, in
/// their order (the DeviceClass's before the claim's), a later knob over an
/// earlier one (`default` included). Tuning acts on all the claim's CPUs, so a config that names
/// requests must name each of `requests`.
pub fn claim_tuning(
    configs: &[DeviceAllocationConfiguration],
    driver: &str,
    requests: &[&str],
) -> Result<Tuning, OpaqueConfigError> {
    let mut tuning = TuningRequest::default();
    for (index, config) in configs.iter().enumerate() {
        let Some(opaque) = config.opaque.as_ref().filter(|o| o.driver == driver) else {
            continue;
        };
        let Some(asked) = parse_parameters(index, &opaque.parameters.0)?.tuning else {
            continue;
        };
        let listed = config.requests.as_deref().unwrap_or_default();
        let missing: Vec<&str> = requests
            .iter()
            .filter(|request| {
                !listed.is_empty() && !listed.iter().any(|entry| names(entry, request))
            })
            .copied()
            .collect();
        if !missing.is_empty() && missing.len() < requests.len() {
            return Err(OpaqueConfigError::TuningNotForEveryRequest {
                index,
                missing: missing.join(", "),
            });
        }
        if missing.is_empty() {
            tuning = tuning.overlaid(&asked);
        }
    }
    Ok(tuning.tuning())
}

#[derive(Debug, Clone, Copy)]
pub struct NodeCpus<'a> {
    pub online: &'a CpuSet,
    pub reserved: &'a CpuSet,
}

/// Check a request's configured cpuset: as many CPUs as it consumed, all
/// online, none reserved, all inside the allocated device, none held by
/// another claim (or by another request of this claim). `holder` names who
/// holds CPUs that clash.
pub fn validate(
    request: &str,
    cpus: &CpuSet,
    consumed: usize,
    node: NodeCpus<'_>,
    device: (&str, &CpuSet),
    taken: &CpuSet,
    holder: impl Fn(&CpuSet) -> String,
) -> Result<(), OpaqueConfigError> {
    let request = request.to_string();
    if cpus.len() != consumed {
        return Err(OpaqueConfigError::Size {
            request,
            cpus: cpus.clone(),
            got: cpus.len(),
            want: consumed,
        });
    }
    let offline = cpus.difference(node.online);
    if !offline.is_empty() {
        return Err(OpaqueConfigError::Offline {
            request,
            cpus: cpus.clone(),
            offline,
        });
    }
    let reserved = cpus.intersection(node.reserved);
    if !reserved.is_empty() {
        return Err(OpaqueConfigError::Reserved {
            request,
            cpus: cpus.clone(),
            reserved,
        });
    }
    let (device, group) = device;
    let outside = cpus.difference(group);
    if !outside.is_empty() {
        return Err(OpaqueConfigError::OutsideDevice {
            request,
            cpus: cpus.clone(),
            outside,
            device: device.to_string(),
            group: group.clone(),
        });
    }
    let clash = cpus.intersection(taken);
    if !clash.is_empty() {
        return Err(OpaqueConfigError::Taken {
            request,
            cpus: cpus.clone(),
            holder: holder(&clash),
            clash,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::resource::v1::OpaqueDeviceConfiguration;
    use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
    use serde_json::json;

    fn set(s: &str) -> CpuSet {
        CpuSet::parse_cpulist(s).expect("cpulist")
    }

    fn config(
        source: &str,
        driver: &str,
        requests: &[&str],
        params: Value,
    ) -> DeviceAllocationConfiguration {
        DeviceAllocationConfiguration {
            source: source.into(),
            requests: Some(requests.iter().map(|r| r.to_string()).collect()),
            opaque: Some(OpaqueDeviceConfiguration {
                driver: driver.into(),
                parameters: RawExtension(params),
            }),
        }
    }

    fn cpuset_params(cpuset: &str) -> Value {
        json!({"apiVersion": "v1alpha1", "cpuConfig": {"cpuset": cpuset}})
    }

    /// Name, configs, the claim's requests, the answer.
    type ParseCase = (
        &'static str,
        Vec<DeviceAllocationConfiguration>,
        &'static [&'static str],
        Result<BTreeMap<String, CpuSet>, OpaqueConfigError>,
    );

    #[test]
    fn parse_table() {
        let ok = |pairs: &[(&str, &str)]| {
            Ok(pairs
                .iter()
                .map(|(r, c)| (r.to_string(), set(c)))
                .collect::<BTreeMap<_, _>>())
        };
        let cases: Vec<ParseCase> = vec![
            ("none", vec![], &["a"], ok(&[])),
            (
                "one request named",
                vec![config("FromClaim", "dra.cpu", &["a"], cpuset_params("2-5"))],
                &["a", "b"],
                ok(&[("a", "2-5")]),
            ),
            (
                "empty requests apply to all",
                vec![config("FromClaim", "dra.cpu", &[], cpuset_params("1"))],
                &["a", "b"],
                ok(&[("a", "1"), ("b", "1")]),
            ),
            (
                "a subrequest result takes its parent's config",
                vec![config("FromClaim", "dra.cpu", &["a"], cpuset_params("3"))],
                &["a/fit"],
                ok(&[("a/fit", "3")]),
            ),
            (
                "another driver's config is not ours, whatever its source",
                vec![config("FromClass", "gpu.example.com", &[], json!({"x": 1}))],
                &["a"],
                ok(&[]),
            ),
            (
                "DeviceClass source",
                vec![config("FromClass", "dra.cpu", &["a"], cpuset_params("2"))],
                &["a"],
                Err(OpaqueConfigError::NotFromClaim {
                    index: 0,
                    config_source: "FromClass".into(),
                }),
            ),
            (
                "two configs for one request",
                vec![
                    config("FromClaim", "dra.cpu", &["a"], cpuset_params("2")),
                    config("FromClaim", "dra.cpu", &[], cpuset_params("3")),
                ],
                &["a"],
                Err(OpaqueConfigError::TwoConfigs {
                    request: "a".into(),
                    first: 0,
                    second: 1,
                }),
            ),
            (
                "bad apiVersion",
                vec![config(
                    "FromClaim",
                    "dra.cpu",
                    &["a"],
                    json!({"apiVersion": "v2", "cpuConfig": {"cpuset": "1"}}),
                )],
                &["a"],
                Err(OpaqueConfigError::ApiVersion {
                    index: 0,
                    found: "v2".into(),
                }),
            ),
            (
                "unknown top-level field",
                vec![config(
                    "FromClaim",
                    "dra.cpu",
                    &["a"],
                    json!({"apiVersion": "v1alpha1", "cpuConfig": {"cpuset": "1"}, "memConfig": {}}),
                )],
                &["a"],
                Err(OpaqueConfigError::UnknownField {
                    index: 0,
                    field: "memConfig".into(),
                }),
            ),
            (
                "unknown cpuConfig field",
                vec![config(
                    "FromClaim",
                    "dra.cpu",
                    &["a"],
                    json!({"apiVersion": "v1alpha1", "cpuConfig": {"cpuset": "1", "policy": "x"}}),
                )],
                &["a"],
                Err(OpaqueConfigError::UnknownField {
                    index: 0,
                    field: "cpuConfig.policy".into(),
                }),
            ),
            (
                "missing cpuset",
                vec![config(
                    "FromClaim",
                    "dra.cpu",
                    &["a"],
                    json!({"apiVersion": "v1alpha1", "cpuConfig": {}}),
                )],
                &["a"],
                Err(OpaqueConfigError::Malformed {
                    index: 0,
                    reason: "cpuConfig.cpuset is empty or missing".into(),
                }),
            ),
        ];
        for (name, configs, requests, want) in cases {
            assert_eq!(
                cpusets_by_request(&configs, "dra.cpu", requests),
                want,
                "{name}"
            );
        }
        let bad = vec![config("FromClaim", "dra.cpu", &["a"], cpuset_params("5-2"))];
        match cpusets_by_request(&bad, "dra.cpu", &["a"]) {
            Err(OpaqueConfigError::BadCpuset { value, .. }) => assert_eq!(value, "5-2"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn validate_table() {
        let online = set("0-7");
        let reserved = set("0");
        let node = NodeCpus {
            online: &online,
            reserved: &reserved,
        };
        let group = set("0-3");
        let taken = set("3");
        let cases = [
            ("1-2", 2, Ok(())),
            ("1-2", 3, Err("has 2 CPUs but the request consumed 3")),
            ("2,9", 2, Err("CPUs 9 are not online")),
            ("0-1", 2, Err("CPUs 0 are reserved")),
            (
                "2,4",
                2,
                Err("CPUs 4 are not in device cpudevnuma000 (0-3)"),
            ),
            ("2-3", 2, Err("CPUs 3 are already held by claim other")),
        ];
        for (cpus, consumed, want) in cases {
            let got = validate(
                "cpus",
                &set(cpus),
                consumed,
                node,
                ("cpudevnuma000", &group),
                &taken,
                |_| "claim other".to_string(),
            )
            .map_err(|e| e.to_string());
            match (got, want) {
                (Ok(()), Ok(())) => {}
                (Err(message), Err(part)) => {
                    assert!(message.contains(part), "{cpus}: {message}");
                    assert!(message.contains("request cpus"), "{message}");
                    assert!(
                        message.contains(&format!("cpuset {}", set(cpus))),
                        "{message}"
                    );
                }
                (got, want) => panic!("{cpus}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn claim_tuning_table() {
        let tuning = |value: Value| json!({"apiVersion": "v1alpha1", "tuning": value});
        let irqs = Tuning {
            isolate_irqs: true,
            ..Tuning::default()
        };
        let cases: Vec<(&str, Vec<DeviceAllocationConfiguration>, Result<Tuning, String>)> = vec![
            ("no config asks nothing", vec![], Ok(Tuning::default())),
            (
                "a claim config for every request",
                vec![config("FromClaim", "dra.cpu", &[], tuning(json!({"irqs": "isolate"})))],
                Ok(irqs.clone()),
            ),
            (
                "a class config is honoured",
                vec![config("FromClass", "dra.cpu", &["a", "b"], tuning(json!({"irqs": "isolate"})))],
                Ok(irqs.clone()),
            ),
            (
                "the claim's knob wins over the class's",
                vec![
                    config("FromClass", "dra.cpu", &[], tuning(json!({"idle": {"maxLatencyMicroseconds": 50}, "irqs": "isolate"}))),
                    config("FromClaim", "dra.cpu", &[], tuning(json!({"idle": {"maxLatencyMicroseconds": 0}}))),
                ],
                Ok(Tuning {
                    isolate_irqs: true,
                    max_idle_latency_us: Some(0),
                    ..Tuning::default()
                }),
            ),
            (
                "the claim's default sets back the class's knob",
                vec![
                    config("FromClass", "dra.cpu", &[], tuning(json!({"irqs": "isolate", "cfsQuota": "off"}))),
                    config("FromClaim", "dra.cpu", &[], tuning(json!({"irqs": "default"}))),
                ],
                Ok(Tuning {
                    cfs_quota_off: true,
                    ..Tuning::default()
                }),
            ),
            (
                "beside a cpuset",
                vec![config(
                    "FromClaim",
                    "dra.cpu",
                    &[],
                    json!({"apiVersion": "v1alpha1", "cpuConfig": {"cpuset": "2"}, "tuning": {"cfsQuota": "off"}}),
                )],
                Ok(Tuning {
                    cfs_quota_off: true,
                    ..Tuning::default()
                }),
            ),
            (
                "a config for requests of another driver only",
                vec![config("FromClaim", "dra.cpu", &["gpu"], tuning(json!({"irqs": "isolate"})))],
                Ok(Tuning::default()),
            ),
            (
                "a config for some of the requests",
                vec![config("FromClaim", "dra.cpu", &["a"], tuning(json!({"irqs": "isolate"})))],
                Err("config 0: tuning applies to all of a claim's CPUs, so it must name every request of this driver or none; it leaves out b".into()),
            ),
            (
                "an unknown knob is named",
                vec![config("FromClaim", "dra.cpu", &[], tuning(json!({"irqs": "isolate", "smt": "off"})))],
                Err("config 0: unknown key tuning.smt (known: irqs, cfsQuota, loadBalancing, idle, governor)".into()),
            ),
            (
                "neither key",
                vec![config("FromClaim", "dra.cpu", &[], json!({"apiVersion": "v1alpha1"}))],
                Err("config 0: neither cpuConfig nor tuning is set".into()),
            ),
        ];
        for (name, configs, want) in cases {
            let got = claim_tuning(&configs, "dra.cpu", &["a", "b"]).map_err(|e| e.to_string());
            assert_eq!(got, want, "{name}");
        }
        // A tuning-only class config is not a cpuset config: no CPUs, no refusal.
        let class = vec![config(
            "FromClass",
            "dra.cpu",
            &[],
            tuning(json!({"irqs": "isolate"})),
        )];
        assert_eq!(
            cpusets_by_request(&class, "dra.cpu", &["a"]),
            Ok(BTreeMap::new())
        );
    }
}
