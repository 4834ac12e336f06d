//! The config file and mounts the Helm chart renders for nri-plugin, read by
//! nri-plugin's own config loader: every mode with the NRI side must parse,
//! resolve to the settings its values ask for, agree with dra-plugin's file
//! on what both share, and find its sockets in mounted directories.
//!
//! Needs `helm` (scripts/install-deps.sh installs it; `HELM` overrides it).

// A panic in test code is a failed test, not a crash on user input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use dra_cpu_daemon::daemon::LogFormat;
use dra_cpu_tests::chart::{object, render};
use nri_plugin::config::{parse_file, Config, UnsolicitedUpdates};
use std::path::{Path, PathBuf};

struct Rendered {
    config: Config,
    /// dra-plugin's file, as YAML, for the settings both must share.
    dra_plugin: serde_json::Value,
    mounts: Vec<(PathBuf, bool)>,
}

fn nri_plugin(values: Option<&str>) -> Rendered {
    let docs = render(values);
    let data = &object(&docs, "ConfigMap")["data"];
    let text = data["nri-plugin.yaml"]
        .as_str()
        .unwrap_or_else(|| panic!("{values:?}: no nri-plugin.yaml"));
    let config = parse_file(Path::new("/etc/dra-cpu/nri-plugin.yaml"), text)
        .and_then(|s| s.resolve())
        .unwrap_or_else(|e| panic!("{values:?}: {e}"));
    let dra_plugin = dra_cpu_daemon::config_file::from_yaml(
        data["dra-plugin.yaml"].as_str().expect("dra-plugin.yaml"),
    )
    .expect("dra-plugin.yaml is YAML");
    let pod = &object(&docs, "DaemonSet")["spec"]["template"]["spec"];
    let container = pod["containers"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"].as_str() == Some("nri-plugin")))
        .expect("nri-plugin container");
    let mounts = container["volumeMounts"]
        .as_array()
        .expect("mounts")
        .iter()
        .map(|m| {
            (
                PathBuf::from(m["mountPath"].as_str().expect("mountPath")),
                m["readOnly"].as_bool().unwrap_or(false),
            )
        })
        .collect();
    Rendered {
        config,
        dra_plugin,
        mounts,
    }
}

#[test]
fn every_mode_with_nri_resolves_and_agrees_with_dra_plugin() {
    type Check = fn(&Config) -> bool;
    let cases: [(Option<&str>, Check); 6] = [
        (None, |c| {
            c.nri_socket == Path::new("/var/run/nri/nri.sock")
                && c.plugin_name == "dra_cpu"
                && c.plugin_index == "10"
                && c.unsolicited_updates == UnsolicitedUpdates::Auto
                && !c.align_memory
                && !c.mixed_allocation_mode
                && c.metrics_address.port() == 9441
                && c.log_format == LogFormat::Text
        }),
        (Some("individual-values.yaml"), |c| !c.mixed_allocation_mode),
        (Some("group-by-socket-values.yaml"), |c| {
            !c.mixed_allocation_mode
        }),
        (Some("mixed-values.yaml"), |c| c.mixed_allocation_mode),
        (Some("no-node-allocatable-mapping-values.yaml"), |c| {
            c.plugin_index == "10"
        }),
        (Some("everything-set-values.yaml"), |c| {
            c.nri_socket == Path::new("/run/containerd/nri/nri.sock")
                && c.plugin_name == "cpu_pinning"
                && c.plugin_index == "05"
                && c.unsolicited_updates == UnsolicitedUpdates::Never
                && c.align_memory
                && c.mixed_allocation_mode
                && c.reserved_cpus.to_cpulist() == "0-1,64-65"
                && c.metrics_address.port() == 19441
                && c.log_format == LogFormat::Json
        }),
    ];
    for (values, check) in cases {
        let r = nri_plugin(values);
        let c = &r.config;
        assert!(check(c), "{values:?}: {c:#?}");
        let shared = |key: &str| r.dra_plugin[key].clone();
        assert_eq!(
            Some(c.coordination_socket.to_string_lossy().as_ref()),
            shared("coordination-socket").as_str(),
            "{values:?}: coordination socket"
        );
        assert_eq!(
            Some(c.mixed_allocation_mode),
            shared("mixed-allocation-mode").as_bool(),
            "{values:?}: mixed allocation mode"
        );
        assert_eq!(
            Some(c.cdi_dir.to_string_lossy().as_ref()),
            shared("cdi-dir").as_str(),
            "{values:?}: CDI dir"
        );
        assert_eq!(
            c.reserved_cpus.to_cpulist(),
            shared("reserved-cpus").as_str().unwrap_or(""),
            "{values:?}: reserved CPUs"
        );
        let mounted = |path: &Path| r.mounts.iter().find(|(m, _)| path.starts_with(m));
        for socket in [&c.nri_socket, &c.coordination_socket] {
            let parent = socket.parent().expect("socket has a directory");
            assert!(
                mounted(parent).is_some(),
                "{values:?}: socket {} is in no mounted directory ({:?})",
                socket.display(),
                r.mounts
            );
        }
        // Reading the CDI specs and sysfs is all nri-plugin does with them.
        for read_only in [&c.cdi_dir, &c.sysfs_root.join("sys")] {
            assert!(
                matches!(mounted(read_only), Some((_, true))),
                "{values:?}: {} is not mounted read-only",
                read_only.display()
            );
        }
    }
}

#[test]
fn host_cgroups_are_off_by_default_and_the_cgroup_root_writable_only_when_listed() {
    let default = nri_plugin(None);
    assert!(default.config.host_cgroups.is_empty());
    let everything = nri_plugin(Some("everything-set-values.yaml"));
    assert_eq!(
        everything.config.host_cgroups,
        ["system.slice", "user.slice"]
    );
    for (values, r, cgroup_mounted) in [
        ("default", &default, false),
        ("everything-set", &everything, true),
    ] {
        let c = &r.config;
        let mount = |path: &Path| r.mounts.iter().find(|(m, _)| m == path);
        // The state directory must be writable: it records what to restore.
        assert_eq!(
            mount(&c.state_dir),
            Some(&(c.state_dir.clone(), false)),
            "{values}: {:?}",
            r.mounts
        );
        // Mounted always (containers' cpusets are read back), writable
        // only with host cgroups listed.
        assert_eq!(
            mount(&c.cgroup_root).map(|(_, ro)| !ro),
            Some(cgroup_mounted),
            "{values}: cgroup root {} in {:?}",
            c.cgroup_root.display(),
            r.mounts
        );
        assert_eq!(
            c.cpuset_check,
            Some(std::time::Duration::from_secs(10)),
            "{values}"
        );
    }
}

#[test]
fn without_nri_there_is_no_nri_plugin() {
    let docs = render(Some("no-nri-values.yaml"));
    assert!(object(&docs, "ConfigMap")["data"]
        .get("nri-plugin.yaml")
        .is_none());
    let containers = object(&docs, "DaemonSet")["spec"]["template"]["spec"]["containers"]
        .as_array()
        .expect("containers")
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect::<Vec<_>>();
    assert_eq!(containers, ["dra-plugin"]);
}
