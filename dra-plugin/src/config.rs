//! Flags and the YAML config file of `dra-plugin run`.
//!
//! Both are read into the same [`Settings`] type, whose every field is
//! optional: a flag given on the command line wins over the file, the file
//! wins over the built-in default. The file's keys are the flag names
//! without the leading dashes (`driver-name: dra.cpu`); an unknown key is an
//! error, so a typo cannot silently leave a default in force.

// The device options are the slice builder's own types, so that a mode
// read from flags is exactly the one the slices are built for.
use crate::devices::{CpuDeviceMode, GroupBy};
use crate::k8s_names::is_driver_name;
use crate::settings::Settings;
use crate::tuning::owner::DaemonSetRef;
use crate::upstream_config::{self, UpstreamConfigError};
use dra_cpu_daemon::config_file::{self, ConfigFileError};
use dra_cpu_daemon::daemon::LogFormat;
use shared_state::alloc::Policy;
use shared_state::CpuSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

pub const DEFAULT_DRIVER_NAME: &str = "dra.cpu";
pub const DEFAULT_KUBELET_ROOT_DIR: &str = "/var/lib/kubelet";
pub const DEFAULT_STATE_DIR: &str = "/var/lib/dra-cpu";
pub const DEFAULT_CDI_DIR: &str = "/var/run/cdi";
pub const DEFAULT_SYSFS_ROOT: &str = "/";
pub const DEFAULT_PROCFS_ROOT: &str = "/proc";
pub const DEFAULT_CGROUP_ROOT: &str = "/sys/fs/cgroup";
/// Where irqbalance puts its socket (its systemd unit's RuntimeDirectory).
pub const DEFAULT_IRQBALANCE_DIR: &str = "/run/irqbalance";
/// File of the tuning record (values before tuning changed them) inside
/// the state directory.
pub const TUNING_RECORD_NAME: &str = "tuning-baseline.json";
/// File name of the coordination socket inside the state directory.
pub const COORDINATION_SOCKET_NAME: &str = "coordination.sock";
/// Directory of the sled store inside the state directory.
pub const STORE_DIR_NAME: &str = "store";
/// `[::]`: IPv6 and IPv4 (`dra_cpu_daemon::http`).
pub const DEFAULT_METRICS_ADDRESS: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED), 9440);
/// The shared pool keeps at least this many CPUs unless configured.
pub const DEFAULT_MIN_SHARED_CPUS: u32 = 1;
/// Environment variable holding the node name (the Downward API sets it).
pub const NODE_NAME_ENV: &str = "NODE_NAME";

/// Why the settings could not be turned into a [`Config`].
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(transparent)]
    File(#[from] ConfigFileError),
    #[error("config file {path} (the upstream driver's format): {source}")]
    Upstream {
        path: PathBuf,
        #[source]
        source: UpstreamConfigError,
    },
    #[error(
        "no node name: pass --node-name, set node-name in the config file, or set ${NODE_NAME_ENV}"
    )]
    NoNodeName,
    #[error("driver name {0:?} is not a DNS subdomain (lowercase letters, digits, '-' and '.', at most 63 characters)")]
    BadDriverName(String),
    #[error("--coordination-allowed-uids is empty: nobody could subscribe")]
    NoAllowedUids,
    #[error("--device-metadata-dir {dir}: {why}")]
    BadDeviceMetadataDir { dir: PathBuf, why: &'static str },
}

/// The settings of a running plugin, defaults applied.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub driver_name: String,
    pub node_name: String,
    pub kubeconfig: Option<PathBuf>,
    pub kubelet_root_dir: PathBuf,
    pub state_dir: PathBuf,
    pub cdi_dir: PathBuf,
    pub sysfs_root: PathBuf,
    pub reserved_cpus: CpuSet,
    pub device_mode: CpuDeviceMode,
    pub group_by: GroupBy,
    pub allocation_policy: Policy,
    pub mixed_allocation_mode: bool,
    pub node_allocatable_mapping: bool,
    /// Write KEP-5304 device metadata for prepared claims.
    pub device_metadata: bool,
    /// Where the device metadata files go on the host.
    pub device_metadata_dir: PathBuf,
    pub expose_pcie_roots: bool,
    pub coordination_socket: PathBuf,
    pub coordination_allowed_uids: Vec<u32>,
    pub metrics_address: SocketAddr,
    pub log_format: LogFormat,
    pub allow_kubelet_static_cpu_manager: bool,
    pub min_shared_cpus: u32,
    pub low_latency_tuning: bool,
    pub procfs_root: PathBuf,
    pub daemonset: Option<DaemonSetRef>,
    pub cgroup_root: PathBuf,
    pub irqbalance_dir: PathBuf,
}

/// Parse a config file's text: this driver's own keys, or the upstream
/// driver's v1alpha1 file.
pub fn parse_file(path: &Path, text: &str) -> Result<Settings, ConfigError> {
    let upstream_error = |source| ConfigError::Upstream {
        path: path.to_path_buf(),
        source,
    };
    if let serde_json::Value::Object(map) = config_file::parse::<serde_json::Value>(path, text)? {
        if upstream_config::classify(&map).map_err(upstream_error)?
            == upstream_config::FileKind::Upstream
        {
            return upstream_config::to_settings(&map).map_err(upstream_error);
        }
    }
    Ok(config_file::parse(path, text)?)
}

/// Read and parse a config file.
pub fn load_file(path: &Path) -> Result<Settings, ConfigError> {
    parse_file(path, &config_file::read(path)?)
}

impl Settings {
    /// Apply defaults; `env_node_name` is `$NODE_NAME`, used when neither
    /// flag nor file names the node.
    pub fn resolve(self, env_node_name: Option<String>) -> Result<Config, ConfigError> {
        let driver_name = self
            .driver_name
            .unwrap_or_else(|| DEFAULT_DRIVER_NAME.to_string());
        if !is_driver_name(&driver_name) {
            return Err(ConfigError::BadDriverName(driver_name));
        }
        let node_name = self
            .node_name
            .or(env_node_name)
            .filter(|name| !name.trim().is_empty())
            .ok_or(ConfigError::NoNodeName)?;
        let state_dir = self
            .state_dir
            .unwrap_or_else(|| PathBuf::from(DEFAULT_STATE_DIR));
        let coordination_socket = self
            .coordination_socket
            .unwrap_or_else(|| state_dir.join(COORDINATION_SOCKET_NAME));
        let coordination_allowed_uids = self.coordination_allowed_uids.unwrap_or_else(|| vec![0]);
        if coordination_allowed_uids.is_empty() {
            return Err(ConfigError::NoAllowedUids);
        }
        let kubelet_root_dir = self
            .kubelet_root_dir
            .unwrap_or_else(|| PathBuf::from(DEFAULT_KUBELET_ROOT_DIR));
        let device_metadata_dir = self.device_metadata_dir.unwrap_or_else(|| {
            crate::device_metadata::default_host_root(&plugin_data_dir(
                &kubelet_root_dir,
                &driver_name,
            ))
        });
        let cdi_dir = self
            .cdi_dir
            .unwrap_or_else(|| PathBuf::from(DEFAULT_CDI_DIR));
        if let Some(why) = crate::device_metadata::dir_problem(
            &device_metadata_dir,
            &cdi_dir,
            &state_dir,
            &kubelet_root_dir,
        ) {
            return Err(ConfigError::BadDeviceMetadataDir {
                dir: device_metadata_dir,
                why,
            });
        }
        Ok(Config {
            driver_name,
            node_name,
            kubeconfig: self.kubeconfig,
            kubelet_root_dir,
            state_dir,
            cdi_dir,
            sysfs_root: self
                .sysfs_root
                .unwrap_or_else(|| PathBuf::from(DEFAULT_SYSFS_ROOT)),
            reserved_cpus: self.reserved_cpus.unwrap_or_default(),
            device_mode: self.cpu_device_mode.unwrap_or_default(),
            group_by: self.group_by.unwrap_or_default(),
            allocation_policy: self.allocation_policy.unwrap_or_default(),
            mixed_allocation_mode: self.mixed_allocation_mode.unwrap_or(false),
            node_allocatable_mapping: !self.disable_node_allocatable_mapping.unwrap_or(false),
            device_metadata: !self.disable_device_metadata.unwrap_or(false),
            device_metadata_dir,
            expose_pcie_roots: self.expose_pcie_roots.unwrap_or(false),
            coordination_socket,
            coordination_allowed_uids,
            metrics_address: self.metrics_address.unwrap_or(DEFAULT_METRICS_ADDRESS),
            log_format: self.log_format.unwrap_or_default(),
            allow_kubelet_static_cpu_manager: self
                .allow_kubelet_static_cpu_manager
                .unwrap_or(false),
            min_shared_cpus: self.min_shared_cpus.unwrap_or(DEFAULT_MIN_SHARED_CPUS),
            low_latency_tuning: self.low_latency_tuning.unwrap_or(false),
            procfs_root: self
                .procfs_root
                .unwrap_or_else(|| PathBuf::from(DEFAULT_PROCFS_ROOT)),
            daemonset: self.daemonset,
            cgroup_root: self
                .cgroup_root
                .unwrap_or_else(|| PathBuf::from(DEFAULT_CGROUP_ROOT)),
            irqbalance_dir: self
                .irqbalance_dir
                .unwrap_or_else(|| PathBuf::from(DEFAULT_IRQBALANCE_DIR)),
        })
    }
}

/// `<kubelet-root>/plugins/<driver>`.
fn plugin_data_dir(kubelet_root_dir: &Path, driver_name: &str) -> PathBuf {
    kubelet_root_dir.join("plugins").join(driver_name)
}

impl Config {
    /// `<kubelet-root>/plugins_registry/<driver>-reg.sock`, where kubelet's
    /// plugin watcher looks for new plugins.
    pub fn registration_socket(&self) -> PathBuf {
        self.kubelet_root_dir
            .join("plugins_registry")
            .join(format!("{}-reg.sock", self.driver_name))
    }

    /// `<kubelet-root>/plugins/<driver>/dra.sock`, the endpoint kubelet calls.
    pub fn dra_socket(&self) -> PathBuf {
        self.kubelet_root_dir
            .join("plugins")
            .join(&self.driver_name)
            .join("dra.sock")
    }

    /// `<kubelet-root>/plugins/<driver>`, the plugin data directory (the Go
    /// helper's `PluginDataDirectoryPath`), where device metadata lives.
    pub fn plugin_data_dir(&self) -> PathBuf {
        plugin_data_dir(&self.kubelet_root_dir, &self.driver_name)
    }

    /// The tuning record's file.
    pub fn tuning_record(&self) -> PathBuf {
        self.state_dir.join(TUNING_RECORD_NAME)
    }

    /// The sled store's directory.
    pub fn store_dir(&self) -> PathBuf {
        self.state_dir.join(STORE_DIR_NAME)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dra_cpu_daemon::daemon::parse_flags;
    use proptest::prelude::*;

    fn flags(args: &[&str]) -> Settings {
        match parse_flags(args) {
            Ok(settings) => settings,
            Err(e) => panic!("{args:?}: {e}"),
        }
    }

    #[test]
    fn defaults() {
        let config = Settings::default()
            .resolve(Some("node-a".into()))
            .expect("defaults resolve");
        assert_eq!(config.driver_name, "dra.cpu");
        assert_eq!(config.node_name, "node-a");
        assert_eq!(config.kubeconfig, None);
        assert_eq!(
            config.registration_socket(),
            PathBuf::from("/var/lib/kubelet/plugins_registry/dra.cpu-reg.sock")
        );
        assert_eq!(
            config.dra_socket(),
            PathBuf::from("/var/lib/kubelet/plugins/dra.cpu/dra.sock")
        );
        assert_eq!(
            config.coordination_socket,
            PathBuf::from("/var/lib/dra-cpu/coordination.sock")
        );
        assert_eq!(config.store_dir(), PathBuf::from("/var/lib/dra-cpu/store"));
        assert_eq!(config.cdi_dir, PathBuf::from("/var/run/cdi"));
        assert_eq!(config.device_mode, CpuDeviceMode::Auto);
        assert_eq!(config.group_by, GroupBy::Numanode);
        assert_eq!(config.allocation_policy, Policy::Packed);
        assert!(!config.mixed_allocation_mode);
        assert!(config.node_allocatable_mapping);
        assert!(config.device_metadata, "device metadata is on by default");
        assert_eq!(
            config.plugin_data_dir(),
            PathBuf::from("/var/lib/kubelet/plugins/dra.cpu")
        );
        assert_eq!(
            config.device_metadata_dir,
            PathBuf::from("/var/lib/kubelet/plugins/dra.cpu/dra-device-metadata")
        );
        assert!(!config.expose_pcie_roots);
        assert_eq!(config.coordination_allowed_uids, vec![0]);
        assert_eq!(config.log_format, LogFormat::Text);
    }

    #[test]
    fn a_device_metadata_dir_holding_the_cdi_dir_is_refused() {
        let refused = flags(&["--node-name=n", "--device-metadata-dir=/var/run"])
            .resolve(None)
            .err()
            .map(|e| e.to_string());
        assert_eq!(
            refused.as_deref(),
            Some("--device-metadata-dir /var/run: must not be or hold the CDI directory")
        );
    }

    /// A value other than the default for every flag the file test below
    /// also sets.
    const EVERY_FLAG: [&str; 20] = [
        "--driver-name=cpu.example.com",
        "--node-name=n1",
        "--kubeconfig=/k",
        "--kubelet-root-dir=/kl",
        "--state-dir=/st",
        "--cdi-dir=/cdi",
        "--sysfs-root=/host",
        "--reserved-cpus=0-1",
        "--cpu-device-mode=individual",
        "--group-by=socket",
        "--allocation-policy=full-pcpus-only",
        "--mixed-allocation-mode=true",
        "--disable-node-allocatable-mapping=true",
        "--disable-device-metadata=true",
        "--device-metadata-dir=/run/md",
        "--expose-pcie-roots=true",
        "--coordination-socket=/c.sock",
        "--coordination-allowed-uids=0,1000",
        "--metrics-address=127.0.0.1:9000",
        "--log-format=json",
    ];

    #[test]
    fn every_flag_parses() {
        let s = flags(&EVERY_FLAG);
        // A switch given bare is the switch set to true.
        let bare = [
            "--mixed-allocation-mode",
            "--disable-node-allocatable-mapping",
            "--disable-device-metadata",
            "--expose-pcie-roots",
        ];
        let with_true = bare.map(|switch| format!("{switch}=true"));
        assert_eq!(
            flags(&bare),
            flags(&with_true.each_ref().map(String::as_str))
        );
        let c = s.resolve(None).expect("resolves");
        assert!(!c.device_metadata);
        assert_eq!(c.device_metadata_dir, PathBuf::from("/run/md"));
        assert_eq!(c.driver_name, "cpu.example.com");
        assert_eq!(c.node_name, "n1");
        assert_eq!(c.kubeconfig, Some(PathBuf::from("/k")));
        assert_eq!(c.kubelet_root_dir, PathBuf::from("/kl"));
        assert_eq!(c.store_dir(), PathBuf::from("/st/store"));
        assert_eq!(c.cdi_dir, PathBuf::from("/cdi"));
        assert_eq!(c.sysfs_root, PathBuf::from("/host"));
        assert_eq!(c.reserved_cpus.to_cpulist(), "0-1");
        assert_eq!(c.device_mode, CpuDeviceMode::Individual);
        assert_eq!(c.group_by, GroupBy::Socket);
        assert_eq!(c.allocation_policy, Policy::FullPcpusOnly);
        assert!(c.mixed_allocation_mode);
        assert!(!c.node_allocatable_mapping);
        assert!(c.expose_pcie_roots);
        assert_eq!(c.coordination_socket, PathBuf::from("/c.sock"));
        assert_eq!(c.coordination_allowed_uids, vec![0, 1000]);
        assert_eq!(c.metrics_address.to_string(), "127.0.0.1:9000");
        assert_eq!(c.log_format, LogFormat::Json);
    }

    #[test]
    fn every_file_key_parses_and_matches_the_flags() {
        let text = "\
driver-name: cpu.example.com
node-name: n1
kubeconfig: /k
kubelet-root-dir: /kl
state-dir: /st
cdi-dir: /cdi
sysfs-root: /host
reserved-cpus: 0-1
cpu-device-mode: individual
group-by: socket
allocation-policy: full-pcpus-only
mixed-allocation-mode: true
disable-node-allocatable-mapping: true
disable-device-metadata: true
device-metadata-dir: /run/md
expose-pcie-roots: true
coordination-socket: /c.sock
coordination-allowed-uids: [0, 1000]
metrics-address: 127.0.0.1:9000
log-format: json
";
        let from_file = parse_file(Path::new("c.yaml"), text).expect("parses");
        let from_flags = flags(&EVERY_FLAG);
        assert_eq!(from_file, from_flags);
    }

    #[test]
    fn every_policy_is_read_from_flag_and_file() {
        for policy in [
            Policy::Packed,
            Policy::FullPcpusOnly,
            Policy::DistributeAcrossNuma,
            Policy::DistributeAcrossCores,
        ] {
            let flag = format!("--allocation-policy={policy}");
            let from_flag = flags(&[flag.as_str()])
                .resolve(Some("n".into()))
                .expect("resolves");
            assert_eq!(from_flag.allocation_policy, policy, "{flag}");
            let text = format!("allocation-policy: {policy}\n");
            let from_file = parse_file(Path::new("c.yaml"), &text)
                .expect("parses")
                .resolve(Some("n".into()))
                .expect("resolves");
            assert_eq!(from_file.allocation_policy, policy, "{text}");
        }
    }

    #[test]
    fn file_errors_name_the_problem() {
        let cases = [
            ("driver-nme: x\n", "unknown field `driver-nme`"),
            ("group-by: core\n", "unknown variant `core`"),
            ("reserved-cpus: 3-1\n", "3-1"),
            ("allocation-policy: spread\n", "spread"),
            ("- a\n", "expected mapping"),
        ];
        for (text, fragment) in cases {
            match parse_file(Path::new("/etc/dra-cpu/config.yaml"), text) {
                Ok(s) => panic!("{text:?} parsed as {s:?}"),
                Err(e) => {
                    let message = e.to_string();
                    assert!(message.contains("/etc/dra-cpu/config.yaml"), "{message}");
                    assert!(message.contains(fragment), "{text:?}: {message}");
                }
            }
        }
        assert_eq!(
            parse_file(Path::new("x"), "  \n").ok(),
            Some(Settings::default())
        );
    }

    #[test]
    fn flags_override_file_which_overrides_defaults() {
        let file = parse_file(
            Path::new("c.yaml"),
            "node-name: from-file\ngroup-by: socket\nstate-dir: /file\n",
        )
        .expect("parses");
        let c = flags(&["--group-by=machine"])
            .or(file)
            .resolve(Some("from-env".into()))
            .expect("resolves");
        assert_eq!(c.group_by, GroupBy::Machine);
        assert_eq!(c.node_name, "from-file");
        assert_eq!(c.state_dir, PathBuf::from("/file"));
        assert_eq!(
            c.coordination_socket,
            PathBuf::from("/file/coordination.sock")
        );
        assert_eq!(c.device_mode, CpuDeviceMode::Auto, "the default");
        for (text, mode) in [
            ("auto", CpuDeviceMode::Auto),
            ("grouped", CpuDeviceMode::Grouped),
            ("individual", CpuDeviceMode::Individual),
        ] {
            let c = flags(&[&format!("--cpu-device-mode={text}")])
                .resolve(Some("n".into()))
                .expect("resolves");
            assert_eq!(c.device_mode, mode, "{text}");
        }
    }

    #[test]
    fn resolve_errors() {
        assert!(matches!(
            Settings::default().resolve(None),
            Err(ConfigError::NoNodeName)
        ));
        assert!(matches!(
            Settings::default().resolve(Some("  ".into())),
            Err(ConfigError::NoNodeName)
        ));
        let bad = Settings {
            driver_name: Some("DRA_CPU".into()),
            ..Settings::default()
        };
        assert!(matches!(
            bad.resolve(Some("n".into())),
            Err(ConfigError::BadDriverName(name)) if name == "DRA_CPU"
        ));
        let nobody = Settings {
            coordination_allowed_uids: Some(vec![]),
            ..Settings::default()
        };
        assert!(matches!(
            nobody.resolve(Some("n".into())),
            Err(ConfigError::NoAllowedUids)
        ));
    }

    proptest! {
        /// `or` takes each field from the first settings that has it.
        #[test]
        fn or_prefers_the_first(a in proptest::option::of("[a-z]{1,8}"), b in proptest::option::of("[a-z]{1,8}")) {
            let first = Settings { node_name: a.clone(), ..Settings::default() };
            let second = Settings { node_name: b.clone(), ..Settings::default() };
            prop_assert_eq!(first.or(second).node_name, a.or(b));
        }
    }

    /// The `driverConfig` of upstream's docs/user/configuration.md
    /// ("#### Example"), which its chart writes as the config file.
    const UPSTREAM_DOCS_EXAMPLE: &str =
        "apiVersion: v1alpha1\ncpuDeviceMode: grouped\ngroupBy: numanode\nreservedCPUs: \"0-3\"\n";

    /// The `driverConfig` example in upstream's
    /// deployment/helm/dra-driver-cpu/values.yaml.
    const UPSTREAM_VALUES_EXAMPLE: &str = "cpuDeviceMode: grouped\ngroupBy: socket\nreservedCPUs: \"0-3\"\npublishNodeAllocatableResourceMapping: true # requires the DRANodeAllocatableResources feature gate\n";

    fn parse_upstream(text: &str) -> Result<Settings, ConfigError> {
        parse_file(Path::new("/etc/dracpu/config.yaml"), text)
    }

    #[test]
    fn upstreams_examples_resolve_to_their_settings() {
        let cases = [
            (UPSTREAM_DOCS_EXAMPLE, GroupBy::Numanode, false),
            (UPSTREAM_VALUES_EXAMPLE, GroupBy::Socket, true),
        ];
        for (text, group_by, mapping) in cases {
            let config = parse_upstream(text)
                .expect("upstream's example parses")
                .resolve(Some("node-a".into()))
                .expect("resolves");
            assert_eq!(config.device_mode, CpuDeviceMode::Grouped, "{text}");
            assert_eq!(config.group_by, group_by, "{text}");
            assert_eq!(config.reserved_cpus.to_cpulist(), "0-3", "{text}");
            assert_eq!(config.node_allocatable_mapping, mapping, "{text}");
            assert_eq!(config.node_name, "node-a");
        }
    }

    #[test]
    fn explicit_flags_win_over_an_upstream_file() {
        let file = parse_upstream(UPSTREAM_DOCS_EXAMPLE).expect("parses");
        let flags = Settings {
            group_by: Some(GroupBy::Socket),
            disable_node_allocatable_mapping: Some(false),
            ..Settings::default()
        };
        let config = flags
            .or(file)
            .resolve(Some("node-a".into()))
            .expect("resolves");
        assert_eq!(config.group_by, GroupBy::Socket);
        assert!(config.node_allocatable_mapping);
        // From the file, no flag given.
        assert_eq!(config.reserved_cpus.to_cpulist(), "0-3");
        // Defaults where neither says anything.
        assert_eq!(config.driver_name, "dra.cpu");
    }

    #[test]
    fn parse_file_refuses_mixed_and_unknown_keys_by_name() {
        for (text, names) in [
            // Upstream refuses a repeated key rather than keep one at random.
            (
                "apiVersion: v1alpha1\nreservedCPUs: \"0-1\"\nreservedCPUs: \"2-3\"\n",
                ["reservedCPUs", "duplicate"],
            ),
            (
                "apiVersion: v1alpha1\nstate-dir: /s\n",
                ["apiVersion", "state-dir"],
            ),
            ("groupBy: socket\nbogusKey: 1\n", ["bogusKey", "bogusKey"]),
        ] {
            let message = match parse_upstream(text) {
                Err(e) => e.to_string(),
                Ok(s) => panic!("{text} accepted: {s:?}"),
            };
            for name in names {
                assert!(message.contains(name), "{message}");
            }
        }
    }
}
