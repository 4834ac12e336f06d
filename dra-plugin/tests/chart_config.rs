//! The config file and mounts the Helm chart renders for dra-plugin, read by
//! dra-plugin's own config loader: every mode must parse, resolve to the
//! settings its values ask for, and put the sockets where the chart mounts
//! the host's directories.
//!
//! Needs `helm` (scripts/install-deps.sh installs it; `HELM` overrides it).

// A panic in test code is a failed test, not a crash on user input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use dra_cpu_daemon::daemon::LogFormat;
use dra_cpu_tests::chart::{object, render};
use dra_plugin::config::{parse_file, Config};
use dra_plugin::devices::{CpuDeviceMode, GroupBy};
use shared_state::alloc::Policy;
use std::path::{Path, PathBuf};

fn str_at<'a>(value: &'a serde_json::Value, path: &[&str]) -> &'a str {
    path.iter()
        .fold(value, |v, key| &v[*key])
        .as_str()
        .unwrap_or_else(|| panic!("no string at {path:?}"))
}

/// dra-plugin's config as the binary would load it, and the container's
/// mount paths.
fn dra_plugin(values: Option<&str>) -> (Config, Vec<PathBuf>) {
    let docs = render(values);
    let text = str_at(object(&docs, "ConfigMap"), &["data", "dra-plugin.yaml"]);
    let settings = parse_file(Path::new("/etc/dra-cpu/dra-plugin.yaml"), text)
        .unwrap_or_else(|e| panic!("{values:?}: {e}"));
    // The chart sets NODE_NAME from the Downward API.
    let config = settings
        .resolve(Some("node-a".into()))
        .unwrap_or_else(|e| panic!("{values:?}: {e}"));
    let pod = &object(&docs, "DaemonSet")["spec"]["template"]["spec"];
    let container = pod["containers"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"].as_str() == Some("dra-plugin")))
        .expect("dra-plugin container");
    let mounts = container["volumeMounts"]
        .as_array()
        .expect("mounts")
        .iter()
        .map(|m| PathBuf::from(m["mountPath"].as_str().expect("mountPath")))
        .collect();
    (config, mounts)
}

#[test]
fn every_mode_resolves_to_what_its_values_ask_for() {
    type Check = fn(&Config) -> bool;
    let cases: [(Option<&str>, Check); 8] = [
        (None, |c| {
            c.driver_name == "dra.cpu"
                && c.device_mode == CpuDeviceMode::Auto
                && c.group_by == GroupBy::Numanode
                && c.allocation_policy == Policy::Packed
                && !c.mixed_allocation_mode
                && c.node_allocatable_mapping
                && !c.expose_pcie_roots
                && c.reserved_cpus.is_empty()
                && c.kubeconfig.is_none()
                && c.coordination_allowed_uids == [0]
                && c.metrics_address.port() == 9440
                && c.log_format == LogFormat::Text
                && c.sysfs_root == Path::new("/host")
        }),
        (Some("individual-values.yaml"), |c| {
            c.device_mode == CpuDeviceMode::Individual
        }),
        (Some("group-by-socket-values.yaml"), |c| {
            c.device_mode == CpuDeviceMode::Auto && c.group_by == GroupBy::Socket
        }),
        (Some("distribute-across-cores-values.yaml"), |c| {
            c.allocation_policy == Policy::DistributeAcrossCores
        }),
        (Some("mixed-values.yaml"), |c| c.mixed_allocation_mode),
        (Some("no-node-allocatable-mapping-values.yaml"), |c| {
            !c.node_allocatable_mapping
        }),
        (Some("no-nri-values.yaml"), |c| {
            c.device_mode == CpuDeviceMode::Auto
        }),
        (Some("everything-set-values.yaml"), |c| {
            c.driver_name == "cpu.example.com"
                && c.reserved_cpus.to_cpulist() == "0-1,64-65"
                && c.group_by == GroupBy::Machine
                && c.allocation_policy == Policy::DistributeAcrossNuma
                && c.mixed_allocation_mode
                && c.kubeconfig.as_deref() == Some(Path::new("/etc/dra-cpu-kubeconfig/kubeconfig"))
                && c.coordination_allowed_uids == [0, 1000]
                && c.coordination_socket == Path::new("/var/lib/cpu-driver/sock/coord.sock")
                && c.metrics_address.port() == 19440
                && c.log_format == LogFormat::Json
                && c.expose_pcie_roots
        }),
    ];
    for (values, check) in cases {
        let (config, mounts) = dra_plugin(values);
        assert!(check(&config), "{values:?}: {config:#?}");
        // Kubelet dials the paths the plugin creates: each socket must lie in
        // a directory the chart mounts from the host at the same path.
        let sockets = [
            config.registration_socket(),
            config.dra_socket(),
            config.coordination_socket.clone(),
        ];
        for socket in sockets {
            let parent = socket.parent().expect("socket has a directory");
            assert!(
                mounts.iter().any(|m| parent.starts_with(m)),
                "{values:?}: socket {} is in no mounted directory ({mounts:?})",
                socket.display()
            );
        }
        assert!(
            mounts.iter().any(|m| config.store_dir().starts_with(m)),
            "{values:?}: store {} is in no mounted directory",
            config.store_dir().display()
        );
        assert!(
            mounts.contains(&config.sysfs_root.join("sys")),
            "{values:?}: sysfs root {} has no sys mount",
            config.sysfs_root.display()
        );
        assert!(
            mounts.contains(&config.cdi_dir),
            "{values:?}: CDI dir not mounted"
        );
    }
}
