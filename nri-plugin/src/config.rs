//! Flags and the YAML config file of nri-plugin.
//!
//! Both are read into the same [`Settings`] type, whose every field is
//! optional: a flag given on the command line wins over the file, the file
//! wins over the built-in default. The file's keys are the flag names
//! without the leading dashes (`plugin-index: "10"`); an unknown key is an
//! error, so a typo cannot silently leave a default in force.

use clap::ValueEnum;
use dra_cpu_daemon::config_file::{self, ConfigFileError};
use dra_cpu_daemon::daemon::LogFormat;
use serde::Deserialize;
use shared_state::CpuSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub const DEFAULT_NRI_SOCKET: &str = dra_cpu_nri::client::DEFAULT_NRI_SOCKET;
pub const DEFAULT_PLUGIN_NAME: &str = "dra_cpu";
pub const DEFAULT_PLUGIN_INDEX: &str = "10";
pub const DEFAULT_COORDINATION_SOCKET: &str = "/var/lib/dra-cpu/coordination.sock";
pub const DEFAULT_CDI_DIR: &str = "/var/run/cdi";
pub const DEFAULT_SYSFS_ROOT: &str = "/";
/// `[::]`: IPv6 and IPv4 (`dra_cpu_daemon::http`).
pub const DEFAULT_METRICS_ADDRESS: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED), 9441);
pub const DEFAULT_CGROUP_ROOT: &str = "/sys/fs/cgroup";
/// How often containers' cpusets are read back: a drift is repaired within
/// two of these.
pub const DEFAULT_CPUSET_CHECK_SECONDS: u64 = 10;
/// Lost at reboot, as the cgroups it describes are.
pub const DEFAULT_STATE_DIR: &str = "/run/dra-cpu/nri-plugin";

/// When nri-plugin may change containers outside an event reply.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum UnsolicitedUpdates {
    /// Only on runtimes known to handle them (NRI ≥ 0.12.1).
    #[default]
    Auto,
    Always,
    /// Every change waits for the next event reply.
    Never,
}

impl UnsolicitedUpdates {
    /// Whether an update may be sent now, given what the runtime is.
    pub fn allowed(self, runtime_safe: bool) -> bool {
        match self {
            UnsolicitedUpdates::Auto => runtime_safe,
            UnsolicitedUpdates::Always => true,
            UnsolicitedUpdates::Never => false,
        }
    }
}

dra_cpu_daemon::layered_settings! {
    /// Every setting of nri-plugin, as flags or as config-file keys.
    pub struct Settings {
        /// The runtime's NRI socket.
        pub nri_socket: Option<PathBuf>,
        /// Name this plugin registers under (no '-' or whitespace).
        pub plugin_name: Option<String>,
        /// Two-digit NRI invocation index.
        pub plugin_index: Option<String>,
        /// dra-plugin's coordination socket.
        pub coordination_socket: Option<PathBuf>,
        /// Directory of the CDI specs dra-plugin writes (checked while dra-plugin is down).
        pub cdi_dir: Option<PathBuf>,
        /// Directory containing `sys/devices/system/cpu` (the host's `/`).
        pub sysfs_root: Option<PathBuf>,
        /// CPUs kept for system daemons (cpulist), used until dra-plugin's snapshot arrives.
        pub reserved_cpus: Option<CpuSet>,
        /// A claim container that also requests CPU gets the shared pool too.
        #[arg(num_args = 0..=1, default_missing_value = "true", require_equals = true)]
        pub mixed_allocation_mode: Option<bool>,
        /// auto, always or never.
        #[arg(value_enum)]
        pub unsolicited_updates: Option<UnsolicitedUpdates>,
        /// Restrict a claim container's memory to the NUMA nodes of its CPUs.
        #[arg(num_args = 0..=1, default_missing_value = "true", require_equals = true)]
        pub align_memory: Option<bool>,
        /// host:port of the metrics and /healthz HTTP server.
        pub metrics_address: Option<SocketAddr>,
        /// text or json.
        #[arg(value_enum)]
        pub log_format: Option<LogFormat>,
        /// cgroup v2 paths under the cgroup root (e.g. system.slice) whose
        /// cpuset.cpus follows the shared pool plus the reserved CPUs.
        #[arg(value_delimiter = ',')]
        pub host_cgroups: Option<Vec<String>>,
        /// Where the cgroup v2 hierarchy is mounted (host cgroups, and the
        /// isolated partitions of claims asking `loadBalancing: off`).
        pub cgroup_root: Option<PathBuf>,
        /// nri-plugin's own state (the host cgroups it manages).
        pub state_dir: Option<PathBuf>,
        /// Seconds between read-backs of every running container's cgroup
        /// cpuset; one found twice on another cpuset than the one applied
        /// gets it again (0: no read-back).
        pub cpuset_check_seconds: Option<u64>,
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(transparent)]
    File(#[from] ConfigFileError),
    #[error("plugin index {0:?} must be exactly two digits, e.g. \"10\"")]
    BadIndex(String),
    #[error("plugin name {0:?} must be non-empty and must not contain '-' or whitespace")]
    BadName(String),
}

/// The settings of a running plugin, defaults applied.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub nri_socket: PathBuf,
    pub plugin_name: String,
    pub plugin_index: String,
    pub coordination_socket: PathBuf,
    pub cdi_dir: PathBuf,
    pub sysfs_root: PathBuf,
    pub reserved_cpus: CpuSet,
    pub mixed_allocation_mode: bool,
    pub unsolicited_updates: UnsolicitedUpdates,
    pub align_memory: bool,
    pub metrics_address: SocketAddr,
    pub log_format: LogFormat,
    pub host_cgroups: Vec<String>,
    pub cgroup_root: PathBuf,
    pub state_dir: PathBuf,
    /// `None`: containers' cpusets are not read back.
    pub cpuset_check: Option<Duration>,
}

/// Parse a config file's text.
pub fn parse_file(path: &Path, text: &str) -> Result<Settings, ConfigError> {
    Ok(config_file::parse(path, text)?)
}

/// Read and parse a config file.
pub fn load_file(path: &Path) -> Result<Settings, ConfigError> {
    Ok(config_file::load(path)?)
}

impl Settings {
    /// Apply defaults and check what the runtime would refuse later.
    pub fn resolve(self) -> Result<Config, ConfigError> {
        let plugin_index = self
            .plugin_index
            .unwrap_or_else(|| DEFAULT_PLUGIN_INDEX.to_string());
        if plugin_index.len() != 2 || !plugin_index.bytes().all(|b| b.is_ascii_digit()) {
            return Err(ConfigError::BadIndex(plugin_index));
        }
        let plugin_name = self
            .plugin_name
            .unwrap_or_else(|| DEFAULT_PLUGIN_NAME.to_string());
        if plugin_name.is_empty()
            || plugin_name.contains('-')
            || plugin_name.chars().any(char::is_whitespace)
        {
            return Err(ConfigError::BadName(plugin_name));
        }
        Ok(Config {
            nri_socket: self
                .nri_socket
                .unwrap_or_else(|| PathBuf::from(DEFAULT_NRI_SOCKET)),
            plugin_name,
            plugin_index,
            coordination_socket: self
                .coordination_socket
                .unwrap_or_else(|| PathBuf::from(DEFAULT_COORDINATION_SOCKET)),
            cdi_dir: self
                .cdi_dir
                .unwrap_or_else(|| PathBuf::from(DEFAULT_CDI_DIR)),
            sysfs_root: self
                .sysfs_root
                .unwrap_or_else(|| PathBuf::from(DEFAULT_SYSFS_ROOT)),
            reserved_cpus: self.reserved_cpus.unwrap_or_default(),
            mixed_allocation_mode: self.mixed_allocation_mode.unwrap_or(false),
            unsolicited_updates: self.unsolicited_updates.unwrap_or_default(),
            align_memory: self.align_memory.unwrap_or(false),
            metrics_address: self.metrics_address.unwrap_or(DEFAULT_METRICS_ADDRESS),
            log_format: self.log_format.unwrap_or_default(),
            host_cgroups: self.host_cgroups.unwrap_or_default(),
            cgroup_root: self
                .cgroup_root
                .unwrap_or_else(|| PathBuf::from(DEFAULT_CGROUP_ROOT)),
            state_dir: self
                .state_dir
                .unwrap_or_else(|| PathBuf::from(DEFAULT_STATE_DIR)),
            cpuset_check: match self
                .cpuset_check_seconds
                .unwrap_or(DEFAULT_CPUSET_CHECK_SECONDS)
            {
                0 => None,
                seconds => Some(Duration::from_secs(seconds)),
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dra_cpu_daemon::daemon::parse_flags;

    fn flags(args: &[&str]) -> Settings {
        parse_flags(args).expect("flags")
    }

    #[test]
    fn defaults() {
        let c = Settings::default().resolve().expect("defaults");
        assert_eq!(c.nri_socket, PathBuf::from("/var/run/nri/nri.sock"));
        assert_eq!(c.plugin_index, "10");
        assert_eq!(c.unsolicited_updates, UnsolicitedUpdates::Auto);
        assert!(!c.mixed_allocation_mode && !c.align_memory);
        assert_eq!(c.metrics_address, DEFAULT_METRICS_ADDRESS);
        assert_eq!(c.metrics_address.to_string(), "[::]:9441");
        assert!(c.host_cgroups.is_empty(), "off by default");
        assert_eq!(c.cgroup_root, PathBuf::from("/sys/fs/cgroup"));
    }

    #[test]
    fn cpuset_check_every_ten_seconds_unless_set_or_off() {
        let every = |s: Settings| s.resolve().expect("resolve").cpuset_check;
        assert_eq!(every(Settings::default()), Some(Duration::from_secs(10)));
        assert_eq!(
            every(flags(&["--cpuset-check-seconds", "3"])),
            Some(Duration::from_secs(3))
        );
        assert_eq!(
            every(flags(&["--cpuset-check-seconds", "0"])),
            None,
            "0 turns it off"
        );
        let file = parse_file(Path::new("f.yaml"), "cpuset-check-seconds: 0\n").expect("file");
        assert_eq!(every(Settings::default().or(file)), None);
        assert!(parse_flags::<Settings>(&["--cpuset-check-seconds", "-1"]).is_err());
    }

    #[test]
    fn host_cgroups_from_flags_and_file() {
        let file = parse_file(
            Path::new("f.yaml"),
            "host-cgroups: [system.slice, user.slice]\nstate-dir: /run/x\n",
        )
        .expect("file");
        let c = Settings::default()
            .or(file.clone())
            .resolve()
            .expect("file");
        assert_eq!(c.host_cgroups, vec!["system.slice", "user.slice"]);
        assert_eq!(c.state_dir, PathBuf::from("/run/x"));
        let c = flags(&["--host-cgroups", "a.slice,b.slice", "--host-cgroups", "c"])
            .or(file.clone())
            .resolve()
            .expect("flags");
        assert_eq!(c.host_cgroups, vec!["a.slice", "b.slice", "c"]);
        // An empty list in the file turns it off.
        let off = parse_file(Path::new("f.yaml"), "host-cgroups: []\n").expect("file");
        assert!(off.resolve().expect("off").host_cgroups.is_empty());
    }

    #[test]
    fn flags_win_over_the_file() {
        let file = parse_file(
            Path::new("f.yaml"),
            "plugin-index: \"20\"\nmixed-allocation-mode: true\nunsolicited-updates: never\nreserved-cpus: 0-1\n",
        )
        .expect("file");
        let c = flags(&["--plugin-index", "30", "--align-memory"])
            .or(file)
            .resolve()
            .expect("config");
        assert_eq!(c.plugin_index, "30");
        assert!(c.mixed_allocation_mode && c.align_memory);
        assert_eq!(c.unsolicited_updates, UnsolicitedUpdates::Never);
        assert_eq!(c.reserved_cpus.to_cpulist(), "0-1");
    }

    #[test]
    fn refusals_name_the_bad_value() {
        let err = parse_file(Path::new("/etc/x.yaml"), "plugin-indx: \"10\"\n").expect_err("typo");
        assert!(
            err.to_string().contains("/etc/x.yaml") && err.to_string().contains("plugin-indx"),
            "{err}"
        );
        for (name, idx, needle) in [
            ("a-b", "10", "\"a-b\""),
            ("ok", "1", "\"1\""),
            ("ok", "ab", "\"ab\""),
        ] {
            let s = Settings {
                plugin_name: Some(name.into()),
                plugin_index: Some(idx.into()),
                ..Default::default()
            };
            let err = s.resolve().expect_err("bad");
            assert!(err.to_string().contains(needle), "{err}");
        }
        assert!(parse_flags::<Settings>(&["--unsolicited-updates", "sometimes"]).is_err());
        assert!(parse_flags::<Settings>(&["--reserved-cpus", "3-1"]).is_err());
    }

    #[test]
    fn unsolicited_policy_table() {
        use UnsolicitedUpdates::*;
        for (policy, safe, allowed) in [
            (Auto, true, true),
            (Auto, false, false),
            (Always, false, true),
            (Never, true, false),
        ] {
            assert_eq!(policy.allowed(safe), allowed, "{policy:?} {safe}");
        }
    }
}
