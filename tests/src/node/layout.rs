//! How a node runs: its options, where it keeps its files, the flags of its
//! two processes and where their binaries are.

use super::NodeError;
use crate::apiserver::FakeApiServerOptions;
use crate::containerd::config::ContainerdOptions;
use crate::kubelet_dra::DraVersion;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// How to run a node.
#[derive(Debug, Clone)]
pub struct NodeOptions {
    pub node_name: String,
    /// `--mixed-allocation-mode` on both processes.
    pub mixed_allocation_mode: bool,
    /// Publish the KEP-5517 mapping (off: `--disable-node-allocatable-mapping`).
    pub node_allocatable_mapping: bool,
    /// The DRA API version the kubelet stand-in talks.
    pub dra_version: DraVersion,
    pub containerd: ContainerdOptions,
    /// The fake API server keeps `nodeAllocatableResources` (feature gate on).
    pub api_keeps_node_allocatable: bool,
    /// The release (and feature gates) the fake API server plays.
    pub api: FakeApiServerOptions,
    /// `--cpu-device-mode` of dra-plugin; its default (auto) when unset.
    pub cpu_device_mode: Option<String>,
    /// `--reserved-cpus` on both processes (a cpulist; none when empty).
    pub reserved_cpus: String,
    /// `--allocation-policy` of dra-plugin (its default when `None`).
    pub allocation_policy: Option<String>,
    /// `--align-memory` on nri-plugin.
    pub align_memory: bool,
    /// `--group-by` of dra-plugin's grouped devices (its default when `None`).
    pub group_by: Option<String>,
    /// `--min-shared-cpus` of dra-plugin (its default when `None`).
    pub min_shared_cpus: Option<u32>,
    /// `--host-cgroups` of nri-plugin (none when empty).
    pub host_cgroups: Vec<String>,
    /// `--cpuset-check-seconds` of nri-plugin (its default when `None`).
    pub cpuset_check_seconds: Option<u64>,
    /// nri-plugin sees the host's cpuset hierarchy read-only, as the chart
    /// mounts it without low-latency tuning (its `--cgroup-root` a
    /// read-only bind in a mount namespace of its own).
    pub read_only_cgroups: bool,
    /// KEP-5304 device metadata (off: `--disable-device-metadata`).
    pub device_metadata: bool,
    /// `--low-latency-tuning` of dra-plugin: claims' tuning is honoured on
    /// this host's kernel (its `/proc/irq` and `/sys/devices/system/cpu`).
    pub low_latency_tuning: bool,
}

impl Default for NodeOptions {
    fn default() -> Self {
        NodeOptions {
            node_name: "node-a".to_string(),
            mixed_allocation_mode: false,
            node_allocatable_mapping: true,
            dra_version: DraVersion::V1,
            containerd: ContainerdOptions::default(),
            api_keeps_node_allocatable: true,
            api: FakeApiServerOptions::default(),
            cpu_device_mode: None,
            reserved_cpus: String::new(),
            allocation_policy: None,
            align_memory: false,
            group_by: None,
            min_shared_cpus: None,
            host_cgroups: Vec::new(),
            cpuset_check_seconds: None,
            read_only_cgroups: false,
            device_metadata: true,
            low_latency_tuning: false,
        }
    }
}

/// Where one node keeps its files (all under one short directory, so socket
/// paths stay far below the 107-byte limit).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeLayout {
    pub dir: PathBuf,
    pub nri_socket: PathBuf,
    pub cdi_dir: PathBuf,
    pub kubeconfig: PathBuf,
    pub dra_metrics: SocketAddr,
    pub nri_metrics: SocketAddr,
}

impl NodeLayout {
    pub fn kubelet_root(&self) -> PathBuf {
        self.dir.join("kubelet")
    }
    pub fn plugins_registry(&self) -> PathBuf {
        self.kubelet_root().join("plugins_registry")
    }
    pub fn state_dir(&self) -> PathBuf {
        self.dir.join("state")
    }
    pub fn coordination_socket(&self) -> PathBuf {
        self.state_dir().join("coordination.sock")
    }
    pub fn dra_log(&self) -> PathBuf {
        self.dir.join("dra-plugin.log")
    }
    pub fn nri_log(&self) -> PathBuf {
        self.dir.join("nri-plugin.log")
    }
    /// nri-plugin's `--cgroup-root` with [`NodeOptions::read_only_cgroups`].
    pub fn read_only_cgroup_root(&self) -> PathBuf {
        self.dir.join("cgroup-ro")
    }
    /// nri-plugin's `--state-dir`, the node's own so that no run sees
    /// another's host cgroups.
    pub fn nri_state_dir(&self) -> PathBuf {
        self.dir.join("nri-state")
    }
}

fn flag(on: bool, name: &str) -> Option<String> {
    on.then(|| name.to_string())
}

/// The flags of `dra-plugin run` for a node.
pub fn dra_plugin_args(layout: &NodeLayout, options: &NodeOptions) -> Vec<String> {
    let path = |p: PathBuf| p.to_string_lossy().into_owned();
    let mut args = vec![
        "run".to_string(),
        "--node-name".into(),
        options.node_name.clone(),
        "--kubeconfig".into(),
        path(layout.kubeconfig.clone()),
        "--kubelet-root-dir".into(),
        path(layout.kubelet_root()),
        "--state-dir".into(),
        path(layout.state_dir()),
        "--cdi-dir".into(),
        path(layout.cdi_dir.clone()),
        "--coordination-socket".into(),
        path(layout.coordination_socket()),
        "--sysfs-root".into(),
        "/".into(),
        "--metrics-address".into(),
        layout.dra_metrics.to_string(),
        "--log-format".into(),
        "json".into(),
    ];
    args.extend(flag(
        options.mixed_allocation_mode,
        "--mixed-allocation-mode",
    ));
    args.extend(flag(
        !options.node_allocatable_mapping,
        "--disable-node-allocatable-mapping",
    ));
    if let Some(mode) = &options.cpu_device_mode {
        args.push(format!("--cpu-device-mode={mode}"));
    }
    args.extend(reserved_cpus_args(options));
    if let Some(policy) = &options.allocation_policy {
        args.extend(["--allocation-policy".to_string(), policy.clone()]);
    }
    if let Some(group_by) = &options.group_by {
        args.extend(["--group-by".to_string(), group_by.clone()]);
    }
    if let Some(min) = options.min_shared_cpus {
        args.extend(["--min-shared-cpus".to_string(), min.to_string()]);
    }
    args.extend(flag(!options.device_metadata, "--disable-device-metadata"));
    args.extend(flag(options.low_latency_tuning, "--low-latency-tuning"));
    args
}

/// `--reserved-cpus <list>`, the same on both processes; nothing when none
/// are reserved.
fn reserved_cpus_args(options: &NodeOptions) -> Vec<String> {
    if options.reserved_cpus.is_empty() {
        Vec::new()
    } else {
        vec!["--reserved-cpus".to_string(), options.reserved_cpus.clone()]
    }
}

/// The flags of `nri-plugin` for a node.
pub fn nri_plugin_args(layout: &NodeLayout, options: &NodeOptions) -> Vec<String> {
    let path = |p: &Path| p.to_string_lossy().into_owned();
    let mut args = vec![
        "--nri-socket".to_string(),
        path(&layout.nri_socket),
        "--coordination-socket".into(),
        path(&layout.coordination_socket()),
        "--cdi-dir".into(),
        path(&layout.cdi_dir),
        "--sysfs-root".into(),
        "/".into(),
        "--metrics-address".into(),
        layout.nri_metrics.to_string(),
        "--log-format".into(),
        "json".into(),
    ];
    args.extend(flag(
        options.mixed_allocation_mode,
        "--mixed-allocation-mode",
    ));
    args.extend(reserved_cpus_args(options));
    args.extend(flag(options.align_memory, "--align-memory"));
    args.extend(["--state-dir".to_string(), path(&layout.nri_state_dir())]);
    if !options.host_cgroups.is_empty() {
        args.extend(["--host-cgroups".to_string(), options.host_cgroups.join(",")]);
    }
    if let Some(seconds) = options.cpuset_check_seconds {
        args.extend(["--cpuset-check-seconds".to_string(), seconds.to_string()]);
    }
    if options.read_only_cgroups {
        args.extend([
            "--cgroup-root".to_string(),
            path(&layout.read_only_cgroup_root()),
        ]);
    }
    args
}

/// Where a binary may be: `$env`, else `<target>/debug/<name>`, else
/// `<target>/release/<name>`.
pub fn binary_candidates(name: &str, env_value: Option<&str>, target_dir: &Path) -> Vec<PathBuf> {
    match env_value.filter(|v| !v.is_empty()) {
        Some(path) => vec![PathBuf::from(path)],
        None => vec![
            target_dir.join("debug").join(name),
            target_dir.join("release").join(name),
        ],
    }
}

fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"),
    }
}

pub(super) fn find_binary(name: &'static str, env: &'static str) -> Result<PathBuf, NodeError> {
    let env_value = std::env::var(env).ok();
    let looked = binary_candidates(name, env_value.as_deref(), &target_dir());
    looked
        .iter()
        .find(|p| p.is_file())
        .cloned()
        .ok_or(NodeError::NoBinary {
            what: name,
            env,
            looked,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> NodeLayout {
        NodeLayout {
            dir: PathBuf::from("/tmp/dcpu-node-x"),
            nri_socket: PathBuf::from("/tmp/dcpu-y/nri.sock"),
            cdi_dir: PathBuf::from("/tmp/dcpu-y/cdi"),
            kubeconfig: PathBuf::from("/tmp/k/kubeconfig"),
            dra_metrics: "127.0.0.1:4000".parse().unwrap(),
            nri_metrics: "127.0.0.1:4001".parse().unwrap(),
        }
    }

    fn value_after(args: &[String], name: &str) -> Option<String> {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1).cloned())
    }

    #[test]
    fn process_flags_follow_the_options() {
        let cases = [
            (false, true, false, false),
            (true, true, true, false),
            (false, false, false, true),
            (true, false, true, true),
        ];
        for (mixed, mapping, want_mixed, want_disable) in cases {
            let options = NodeOptions {
                mixed_allocation_mode: mixed,
                node_allocatable_mapping: mapping,
                ..Default::default()
            };
            let dra = dra_plugin_args(&layout(), &options);
            let nri = nri_plugin_args(&layout(), &options);
            assert_eq!(dra[0], "run");
            assert_eq!(
                dra.contains(&"--mixed-allocation-mode".to_string()),
                want_mixed
            );
            assert_eq!(
                nri.contains(&"--mixed-allocation-mode".to_string()),
                want_mixed
            );
            assert_eq!(
                dra.contains(&"--disable-node-allocatable-mapping".to_string()),
                want_disable
            );
            assert_eq!(
                value_after(&dra, "--coordination-socket"),
                value_after(&nri, "--coordination-socket"),
                "both ends of the coordination socket"
            );
            assert_eq!(
                value_after(&dra, "--cdi-dir"),
                value_after(&nri, "--cdi-dir")
            );
            assert_eq!(
                value_after(&nri, "--nri-socket").as_deref(),
                Some("/tmp/dcpu-y/nri.sock")
            );
            assert_eq!(
                value_after(&dra, "--kubelet-root-dir").as_deref(),
                Some("/tmp/dcpu-node-x/kubelet")
            );
            assert_ne!(
                value_after(&dra, "--metrics-address"),
                value_after(&nri, "--metrics-address")
            );
        }
    }

    #[test]
    fn host_cgroups_reach_nri_plugin_only_and_its_state_stays_in_the_node_dir() {
        for (list, want) in [
            (vec![], None),
            (vec!["system.slice"], Some("system.slice")),
            (vec!["a.slice", "b.slice"], Some("a.slice,b.slice")),
        ] {
            let options = NodeOptions {
                host_cgroups: list.iter().map(|c| c.to_string()).collect(),
                ..Default::default()
            };
            let nri = nri_plugin_args(&layout(), &options);
            let dra = dra_plugin_args(&layout(), &options);
            assert_eq!(value_after(&nri, "--host-cgroups").as_deref(), want);
            assert!(!dra.contains(&"--host-cgroups".to_string()));
            assert_eq!(
                value_after(&nri, "--state-dir").map(PathBuf::from),
                Some(layout().nri_state_dir())
            );
        }
    }

    #[test]
    fn policy_reserved_cpus_and_memory_alignment_reach_the_right_process() {
        // (reserved, policy, align, group by) -> what each process gets.
        let cases = [
            ("", None, false, None),
            ("0,4", None, false, Some("socket")),
            ("", Some("full-pcpus-only"), false, None),
            ("1", Some("distribute-across-numa"), true, Some("machine")),
        ];
        for (reserved, policy, align, group_by) in cases {
            let options = NodeOptions {
                reserved_cpus: reserved.to_string(),
                allocation_policy: policy.map(str::to_string),
                align_memory: align,
                group_by: group_by.map(str::to_string),
                ..Default::default()
            };
            let dra = dra_plugin_args(&layout(), &options);
            let nri = nri_plugin_args(&layout(), &options);
            let want_reserved = (!reserved.is_empty()).then(|| reserved.to_string());
            assert_eq!(value_after(&dra, "--reserved-cpus"), want_reserved);
            assert_eq!(value_after(&nri, "--reserved-cpus"), want_reserved);
            assert_eq!(value_after(&dra, "--allocation-policy").as_deref(), policy);
            assert!(!nri.contains(&"--allocation-policy".to_string()));
            assert_eq!(value_after(&dra, "--group-by").as_deref(), group_by);
            assert!(!nri.contains(&"--group-by".to_string()));
            assert_eq!(nri.contains(&"--align-memory".to_string()), align);
            assert!(!dra.contains(&"--align-memory".to_string()));
        }
    }

    #[test]
    fn binary_lookup_prefers_the_variable() {
        let target = Path::new("/w/target");
        let cases: [(Option<&str>, Vec<PathBuf>); 3] = [
            (
                Some("/opt/bin/dra-plugin"),
                vec!["/opt/bin/dra-plugin".into()],
            ),
            (
                Some(""),
                vec![
                    "/w/target/debug/dra-plugin".into(),
                    "/w/target/release/dra-plugin".into(),
                ],
            ),
            (
                None,
                vec![
                    "/w/target/debug/dra-plugin".into(),
                    "/w/target/release/dra-plugin".into(),
                ],
            ),
        ];
        for (env, want) in cases {
            assert_eq!(
                binary_candidates("dra-plugin", env, target),
                want,
                "{env:?}"
            );
        }
    }
}
