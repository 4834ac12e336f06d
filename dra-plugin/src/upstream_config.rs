//! The upstream Go driver's config file (`apiVersion: v1alpha1`,
//! kubernetes-sigs/dra-driver-cpu `internal/driverconfig`), read into this
//! driver's [`Settings`] so that an operator switching drivers keeps their
//! ConfigMap.
//!
//! A file is upstream's when it has `apiVersion` or any of upstream's
//! camelCase keys; this driver's own files use the flag names. A file with
//! keys of both kinds is refused, naming one of each, and so is an unknown
//! key, naming it (with upstream's hint when only its case is wrong).
//!
//! `publishNodeAllocatableResourceMapping` defaults to false upstream, and
//! an upstream file keeps upstream's meaning: without the key, the KEP-5517
//! mapping is not published (it changes how the scheduler accounts node
//! CPU, which a driver switch must not do silently). Explicit flags still
//! win over the file.

use crate::devices::CpuDeviceMode;
use crate::devices::GroupBy;
use crate::settings::Settings;
use serde_json::{Map, Value};
use shared_state::CpuSet;
use std::path::PathBuf;

/// The only `apiVersion` upstream accepts.
pub const API_VERSION: &str = "v1alpha1";

/// Upstream's keys that this driver reads from the file.
const SUPPORTED_KEYS: [&str; 7] = [
    "kubeconfig",
    "hostnameOverride",
    "reservedCPUs",
    "cpuDeviceMode",
    "groupBy",
    "sysfsOverlay",
    "publishNodeAllocatableResourceMapping",
];

/// Upstream's fields that its file refuses, with upstream's hint.
const EXCLUDED_KEYS: [(&str, &str); 3] = [
    ("bindAddress", "use --metrics-address instead"),
    (
        "exposePCIeRoots",
        "use the --expose-pcie-roots flag instead",
    ),
    ("kubeletRootDir", "use --kubelet-root-dir instead"),
];

/// Why an upstream config file was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UpstreamConfigError {
    #[error("unsupported apiVersion {found:?}, want \"v1alpha1\"")]
    ApiVersion { found: String },
    #[error("the file mixes the upstream driver's keys ({upstream:?}) with this driver's keys ({own:?}): use one kind")]
    Mixed { upstream: String, own: String },
    #[error("unknown field {key:?}")]
    UnknownKey { key: String },
    #[error("field {key:?} is spelled differently from the schema; use {want:?}")]
    Misspelled { key: String, want: &'static str },
    #[error("field {key:?} is not configurable via the config file; {hint}")]
    Excluded { key: String, hint: &'static str },
    #[error("field {key:?}: {reason}")]
    BadValue { key: String, reason: String },
    #[error("field \"sysfsOverlay\" ({path:?}) is not supported by this driver: point --sysfs-root at a directory holding the sys/ tree instead")]
    SysfsOverlay { path: String },
}

/// Which driver's file a mapping is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    Own,
    Upstream,
}

/// Whether `key` is one of upstream's (read, or refused by upstream itself).
fn is_upstream_key(key: &str) -> bool {
    key == "apiVersion"
        || SUPPORTED_KEYS.contains(&key)
        || EXCLUDED_KEYS.iter().any(|(k, _)| *k == key)
}

/// This driver's own keys: the flag names of [`Settings`].
fn is_own_key(key: &str) -> bool {
    const OWN: [&str; 18] = [
        "driver-name",
        "node-name",
        "kubeconfig",
        "kubelet-root-dir",
        "state-dir",
        "cdi-dir",
        "sysfs-root",
        "reserved-cpus",
        "cpu-device-mode",
        "group-by",
        "allocation-policy",
        "mixed-allocation-mode",
        "disable-node-allocatable-mapping",
        "disable-device-metadata",
        "coordination-socket",
        "coordination-allowed-uids",
        "metrics-address",
        "log-format",
    ];
    OWN.contains(&key)
}

/// Tell the two kinds of file apart. `kubeconfig` is a key of both; a file
/// with only that key is this driver's.
pub fn classify(map: &Map<String, Value>) -> Result<FileKind, UpstreamConfigError> {
    let mut upstream = None;
    let mut own = None;
    for key in map.keys() {
        let key = key.as_str();
        if key == "kubeconfig" {
            continue;
        }
        if is_upstream_key(key) {
            upstream.get_or_insert(key);
        } else if is_own_key(key) {
            own.get_or_insert(key);
        }
    }
    match (upstream, own) {
        (Some(upstream), Some(own)) => Err(UpstreamConfigError::Mixed {
            upstream: upstream.to_string(),
            own: own.to_string(),
        }),
        (Some(_), None) => Ok(FileKind::Upstream),
        _ => Ok(FileKind::Own),
    }
}

/// A string field; upstream's empty string means unset.
fn string_of(key: &str, value: &Value) -> Result<Option<String>, UpstreamConfigError> {
    match value {
        Value::Null => Ok(None),
        Value::String(s) if s.is_empty() => Ok(None),
        Value::String(s) => Ok(Some(s.clone())),
        other => Err(UpstreamConfigError::BadValue {
            key: key.to_string(),
            reason: format!("want a string, found {other:?}"),
        }),
    }
}

fn bool_of(key: &str, value: &Value) -> Result<Option<bool>, UpstreamConfigError> {
    match value {
        Value::Null => Ok(None),
        Value::Bool(b) => Ok(Some(*b)),
        other => Err(UpstreamConfigError::BadValue {
            key: key.to_string(),
            reason: format!("want true or false, found {other:?}"),
        }),
    }
}

fn bad_enum(key: &str, found: &str, allowed: &str) -> UpstreamConfigError {
    UpstreamConfigError::BadValue {
        key: key.to_string(),
        reason: format!("{found:?} is not one of {allowed}"),
    }
}

/// Read an upstream file's mapping into this driver's settings.
pub fn to_settings(map: &Map<String, Value>) -> Result<Settings, UpstreamConfigError> {
    let mut keys: Vec<(&str, &Value)> = map.iter().map(|(k, v)| (k.as_str(), v)).collect();
    // Sorted, so a file with several problems names the same one every run.
    keys.sort_by(|a, b| a.0.cmp(b.0));
    if let Some((_, version)) = keys.iter().find(|(k, _)| *k == "apiVersion") {
        if version.as_str() != Some(API_VERSION) {
            return Err(UpstreamConfigError::ApiVersion {
                found: match version {
                    Value::String(s) => s.clone(),
                    other => format!("{other:?}"),
                },
            });
        }
    }
    for (key, _) in &keys {
        if is_upstream_key(key) {
            continue;
        }
        let canonical = SUPPORTED_KEYS
            .iter()
            .chain(EXCLUDED_KEYS.iter().map(|(k, _)| k))
            .chain(std::iter::once(&"apiVersion"))
            .find(|want| want.eq_ignore_ascii_case(key));
        return Err(match canonical {
            Some(want) => UpstreamConfigError::Misspelled {
                key: key.to_string(),
                want,
            },
            None => UpstreamConfigError::UnknownKey {
                key: key.to_string(),
            },
        });
    }
    if let Some((key, hint)) = EXCLUDED_KEYS
        .iter()
        .find(|(k, _)| keys.iter().any(|(have, _)| have == k))
    {
        return Err(UpstreamConfigError::Excluded {
            key: key.to_string(),
            hint,
        });
    }
    let mut settings = Settings {
        // Upstream's default, unless the file says otherwise.
        disable_node_allocatable_mapping: Some(true),
        ..Settings::default()
    };
    for (key, value) in keys {
        match key {
            "kubeconfig" => settings.kubeconfig = string_of(key, value)?.map(PathBuf::from),
            "hostnameOverride" => settings.node_name = string_of(key, value)?,
            "reservedCPUs" => {
                settings.reserved_cpus = string_of(key, value)?
                    .map(|list| {
                        CpuSet::parse_cpulist(&list).map_err(|e| UpstreamConfigError::BadValue {
                            key: key.to_string(),
                            reason: e.to_string(),
                        })
                    })
                    .transpose()?;
            }
            "cpuDeviceMode" => {
                settings.cpu_device_mode = match string_of(key, value)?.as_deref() {
                    None => None,
                    Some("grouped") => Some(CpuDeviceMode::Grouped),
                    Some("individual") => Some(CpuDeviceMode::Individual),
                    Some(other) => return Err(bad_enum(key, other, "grouped, individual")),
                }
            }
            "groupBy" => {
                settings.group_by = match string_of(key, value)?.as_deref() {
                    None => None,
                    Some("numanode") => Some(GroupBy::Numanode),
                    Some("socket") => Some(GroupBy::Socket),
                    Some("machine") => Some(GroupBy::Machine),
                    Some(other) => return Err(bad_enum(key, other, "numanode, socket, machine")),
                }
            }
            "sysfsOverlay" => {
                if let Some(path) = string_of(key, value)? {
                    return Err(UpstreamConfigError::SysfsOverlay { path });
                }
            }
            "publishNodeAllocatableResourceMapping" => {
                if let Some(publish) = bool_of(key, value)? {
                    settings.disable_node_allocatable_mapping = Some(!publish);
                }
            }
            _ => {} // apiVersion, checked above
        }
    }
    Ok(settings)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mapping(text: &str) -> Map<String, Value> {
        match dra_cpu_daemon::config_file::from_yaml(text) {
            Ok(m) => m,
            Err(e) => panic!("{text}: {e}"),
        }
    }

    #[test]
    fn classify_table() {
        let cases = [
            ("apiVersion: v1alpha1\n", Ok(FileKind::Upstream)),
            ("groupBy: socket\n", Ok(FileKind::Upstream)),
            ("kubeletRootDir: /x\n", Ok(FileKind::Upstream)),
            ("group-by: socket\n", Ok(FileKind::Own)),
            ("kubeconfig: /k\n", Ok(FileKind::Own)),
            ("{}\n", Ok(FileKind::Own)),
            // Neither kind: this driver's own parser names it.
            ("bogus: 1\n", Ok(FileKind::Own)),
            (
                "apiVersion: v1alpha1\nnode-name: a\n",
                Err(UpstreamConfigError::Mixed {
                    upstream: "apiVersion".into(),
                    own: "node-name".into(),
                }),
            ),
            (
                "state-dir: /s\nreservedCPUs: \"0\"\n",
                Err(UpstreamConfigError::Mixed {
                    upstream: "reservedCPUs".into(),
                    own: "state-dir".into(),
                }),
            ),
        ];
        for (text, want) in cases {
            assert_eq!(classify(&mapping(text)), want, "{text}");
        }
    }

    #[test]
    fn every_upstream_key_maps_to_its_setting() {
        let settings = to_settings(&mapping(
            "apiVersion: v1alpha1\nkubeconfig: /etc/kube/config\nhostnameOverride: node-7\nreservedCPUs: \"0-1,4\"\ncpuDeviceMode: individual\ngroupBy: socket\nsysfsOverlay: \"\"\npublishNodeAllocatableResourceMapping: true\n",
        ))
        .expect("valid");
        assert_eq!(
            settings,
            Settings {
                kubeconfig: Some(PathBuf::from("/etc/kube/config")),
                node_name: Some("node-7".into()),
                reserved_cpus: Some(CpuSet::parse_cpulist("0-1,4").expect("cpulist")),
                cpu_device_mode: Some(CpuDeviceMode::Individual),
                group_by: Some(GroupBy::Socket),
                disable_node_allocatable_mapping: Some(false),
                ..Settings::default()
            }
        );
    }

    #[test]
    fn an_upstream_file_keeps_upstreams_mapping_default() {
        let cases = [
            ("apiVersion: v1alpha1\n", Some(true)),
            ("publishNodeAllocatableResourceMapping: false\n", Some(true)),
            ("publishNodeAllocatableResourceMapping: true\n", Some(false)),
        ];
        for (text, want) in cases {
            let settings = to_settings(&mapping(text)).expect("valid");
            assert_eq!(settings.disable_node_allocatable_mapping, want, "{text}");
        }
    }

    #[test]
    fn refusals_name_the_key() {
        let cases = [
            (
                "apiVersion: v1beta1\n",
                UpstreamConfigError::ApiVersion {
                    found: "v1beta1".into(),
                },
            ),
            (
                "apiVersion: v1alpha1\nreservedcpus: \"0-3\"\n",
                UpstreamConfigError::Misspelled {
                    key: "reservedcpus".into(),
                    want: "reservedCPUs",
                },
            ),
            (
                "apiVersion: v1alpha1\nfrobnicate: true\n",
                UpstreamConfigError::UnknownKey {
                    key: "frobnicate".into(),
                },
            ),
            (
                "apiVersion: v1alpha1\nbindAddress: \":8080\"\n",
                UpstreamConfigError::Excluded {
                    key: "bindAddress".into(),
                    hint: "use --metrics-address instead",
                },
            ),
            (
                "cpuDeviceMode: auto\n",
                UpstreamConfigError::BadValue {
                    key: "cpuDeviceMode".into(),
                    reason: "\"auto\" is not one of grouped, individual".into(),
                },
            ),
            (
                "groupBy: core\n",
                UpstreamConfigError::BadValue {
                    key: "groupBy".into(),
                    reason: "\"core\" is not one of numanode, socket, machine".into(),
                },
            ),
            (
                "publishNodeAllocatableResourceMapping: \"yes\"\n",
                UpstreamConfigError::BadValue {
                    key: "publishNodeAllocatableResourceMapping".into(),
                    reason: "want true or false, found String(\"yes\")".into(),
                },
            ),
            (
                "sysfsOverlay: /etc/overlay.yaml\n",
                UpstreamConfigError::SysfsOverlay {
                    path: "/etc/overlay.yaml".into(),
                },
            ),
        ];
        for (text, want) in cases {
            assert_eq!(to_settings(&mapping(text)), Err(want), "{text}");
        }
        match to_settings(&mapping("reservedCPUs: \"3-1\"\n")) {
            Err(UpstreamConfigError::BadValue { key, .. }) => assert_eq!(key, "reservedCPUs"),
            other => panic!("{other:?}"),
        }
    }
}
