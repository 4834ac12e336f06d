//! Every setting of `dra-plugin run`, each optional, as flags and config
//! files give them; [`crate::config`] applies the defaults.

use crate::devices::{CpuDeviceMode, GroupBy};
use crate::tuning::owner::DaemonSetRef;
use dra_cpu_daemon::daemon::LogFormat;
use shared_state::alloc::Policy;
use shared_state::CpuSet;
use std::net::SocketAddr;
use std::path::PathBuf;

dra_cpu_daemon::layered_settings! {
    /// Every setting of `dra-plugin run`, as flags or as config-file keys.
    pub struct Settings {
        /// DRA driver name (ResourceSlices, claims' allocation results, sockets).
        pub driver_name: Option<String>,
        /// This node's name; defaults to $NODE_NAME.
        pub node_name: Option<String>,
        /// kubeconfig file; in-cluster configuration when unset.
        pub kubeconfig: Option<PathBuf>,
        /// Kubelet root directory (plugins_registry/ and plugins/ live here).
        pub kubelet_root_dir: Option<PathBuf>,
        /// Directory of the assignment store and the coordination socket.
        pub state_dir: Option<PathBuf>,
        /// Directory the container runtime reads CDI specs from.
        pub cdi_dir: Option<PathBuf>,
        /// Directory containing `sys/devices/system/cpu` (the host's `/`).
        pub sysfs_root: Option<PathBuf>,
        /// CPUs kept for system daemons (cpulist); never published.
        pub reserved_cpus: Option<CpuSet>,
        /// auto (grouped where the API server supports consumable capacity,
        /// else individual), grouped or individual.
        #[arg(value_enum)]
        pub cpu_device_mode: Option<CpuDeviceMode>,
        /// Grouped mode: numanode, socket or machine.
        #[arg(value_enum)]
        pub group_by: Option<GroupBy>,
        /// packed, full-pcpus-only, distribute-across-numa or
        /// distribute-across-cores.
        pub allocation_policy: Option<Policy>,
        /// A claim container that also requests CPU gets the shared pool too.
        #[arg(num_args = 0..=1, default_missing_value = "true", require_equals = true)]
        pub mixed_allocation_mode: Option<bool>,
        /// Do not publish the KEP-5517 node-allocatable mapping on devices.
        #[arg(num_args = 0..=1, default_missing_value = "true", require_equals = true)]
        pub disable_node_allocatable_mapping: Option<bool>,
        /// Do not write KEP-5304 device metadata files (and their CDI mounts)
        /// for prepared claims.
        #[arg(num_args = 0..=1, default_missing_value = "true", require_equals = true)]
        pub disable_device_metadata: Option<bool>,
        /// Host directory of the device metadata files, bind-mounted from here
        /// into containers; `<kubelet-root-dir>/plugins/<driver>/dra-device-metadata`
        /// by default. A tmpfs (the chart uses `/var/run/dra-cpu/device-metadata`)
        /// keeps their writes out of the store disk's journal; they are rebuilt
        /// from the store at every start, as the CDI specs are.
        pub device_metadata_dir: Option<PathBuf>,
        /// Publish `resource.kubernetes.io/pcieRoot` on devices: the PCIe roots
        /// local to their CPUs (a list attribute: Kubernetes 1.36+ with the
        /// `DRAListTypeAttributes` feature gate).
        #[arg(num_args = 0..=1, default_missing_value = "true", require_equals = true)]
        pub expose_pcie_roots: Option<bool>,
        /// Unix socket nri-plugin subscribes on; `<state-dir>/coordination.sock` by default.
        pub coordination_socket: Option<PathBuf>,
        /// Peer uids admitted on the coordination socket (comma-separated); root only by default.
        #[arg(value_delimiter = ',')]
        pub coordination_allowed_uids: Option<Vec<u32>>,
        /// host:port of the metrics, /healthz and /readyz HTTP server.
        pub metrics_address: Option<SocketAddr>,
        /// text or json.
        #[arg(value_enum)]
        pub log_format: Option<LogFormat>,
        /// Start even when kubelet runs the static CPU manager policy, which
        /// hands out exclusive CPUs of its own.
        #[arg(num_args = 0..=1, default_missing_value = "true", require_equals = true)]
        pub allow_kubelet_static_cpu_manager: Option<bool>,
        /// Honour the `tuning` of claims' opaque configs (device interrupts,
        /// idle states, cpufreq governor, CFS quota) and publish what this
        /// node supports as device attributes. Needs the host's `/proc/irq`
        /// and `/sys/devices/system/cpu` writable (the chart's `draPlugin.lowLatencyTuning`).
        #[arg(num_args = 0..=1, default_missing_value = "true", require_equals = true)]
        pub low_latency_tuning: Option<bool>,
        /// Directory holding the host's `irq/` (its `/proc`); `/proc` by default.
        pub procfs_root: Option<PathBuf>,
        /// The DaemonSet that runs this plugin (`namespace/name`; the chart
        /// sets it): when it is deleted (`helm uninstall`), the node's
        /// tuning is put back as dra-plugin stops.
        pub daemonset: Option<DaemonSetRef>,
        /// Where the host's cgroup hierarchy is mounted (read only: whether
        /// it is cgroup v2 with isolated partitions, for `loadBalancing: off`,
        /// which nri-plugin makes under its own `--cgroup-root`).
        pub cgroup_root: Option<PathBuf>,
        /// Where a running irqbalance has its socket (the host's
        /// `/run/irqbalance`): while a claim keeps interrupts off its CPUs,
        /// irqbalance is told to ban them too.
        pub irqbalance_dir: Option<PathBuf>,
        /// Fewest CPUs the shared pool keeps: a prepare that would leave fewer
        /// is refused (default 1). Every container without a claim (this
        /// driver's own among them) runs there; 0 lets claims take every CPU
        /// and leaves nri-plugin to refuse shared containers.
        pub min_shared_cpus: Option<u32>,
    }
}
