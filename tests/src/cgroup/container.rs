//! A container's CPUs and environment as its processes see them.

use std::collections::BTreeMap;

use shared_state::CpuSet;

use super::cpuset::{read_cpuset_dir, CgroupCpuset};
use super::hierarchy::cpuset_dir_of;
use super::CgroupError;
use crate::cri::CriClient;

/// The `Cpus_allowed_list` of `/proc/<pid>/status` text.
pub fn parse_cpus_allowed_list(status: &str) -> Option<&str> {
    status.lines().find_map(|line| {
        line.strip_prefix("Cpus_allowed_list:")
            .map(|value| value.trim())
    })
}

/// `env` output as a map (a value may contain `=`; lines without one are
/// continuations of a multi-line value and are skipped).
pub fn parse_env(output: &str) -> BTreeMap<String, String> {
    output
        .lines()
        .filter_map(|line| line.split_once('='))
        .filter(|(key, _)| !key.is_empty())
        .map(|(key, value)| (key.to_string(), value.to_string()))
        .collect()
}

/// Everything that says where a container may run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerCpus {
    /// From the container's cgroup (`cpuset.cpus`, `cpuset.mems`, or their
    /// effective sets when nothing was requested).
    pub cgroup: CgroupCpuset,
    /// `Cpus_allowed_list` of a process started inside the container.
    pub allowed_inside: CpuSet,
}

/// Reads a container's cpuset from its cgroup and from inside it.
pub async fn container_cpus(cri: &mut CriClient, id: &str) -> Result<ContainerCpus, CgroupError> {
    let pid = cri.container_pid(id).await?;
    let cgroup = read_cpuset_dir(&cpuset_dir_of(pid)?)?;
    Ok(ContainerCpus {
        cgroup,
        allowed_inside: cpus_allowed_inside(cri, id).await?,
    })
}

/// `Cpus_allowed_list` of a process exec'd in the container.
pub async fn cpus_allowed_inside(cri: &mut CriClient, id: &str) -> Result<CpuSet, CgroupError> {
    let status = cri.exec_ok(id, &["cat", "/proc/self/status"]).await?;
    let value = parse_cpus_allowed_list(&status).ok_or_else(|| CgroupError::NoCpusAllowed {
        id: id.to_string(),
        output: status.clone(),
    })?;
    CpuSet::parse_cpulist(value).map_err(|source| CgroupError::CpusAllowed {
        id: id.to_string(),
        value: value.to_string(),
        source,
    })
}

/// The environment a process exec'd in the container sees.
pub async fn container_env(
    cri: &mut CriClient,
    id: &str,
) -> Result<BTreeMap<String, String>, CgroupError> {
    Ok(parse_env(&cri.exec_ok(id, &["env"]).await?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpus_allowed_list_is_found() {
        let table = [
            (
                "Name:\tcat\nCpus_allowed:\t3\nCpus_allowed_list:\t0-1\n",
                Some("0-1"),
            ),
            ("Cpus_allowed_list:\t0,2-3", Some("0,2-3")),
            ("Name:\tcat\n", None),
        ];
        for (status, expected) in table {
            assert_eq!(parse_cpus_allowed_list(status), expected, "{status:?}");
        }
    }

    #[test]
    fn env_output_parses_with_equals_in_values() {
        let env = parse_env("PATH=/bin\nA=b=c\nnot a var\n=x\nEMPTY=\n");
        assert_eq!(env.get("PATH").map(String::as_str), Some("/bin"));
        assert_eq!(env.get("A").map(String::as_str), Some("b=c"));
        assert_eq!(env.get("EMPTY").map(String::as_str), Some(""));
        assert_eq!(env.len(), 3);
    }

    proptest::proptest! {
        #[test]
        fn env_round_trips(vars in proptest::collection::btree_map("[A-Z_][A-Z0-9_]{0,8}", "[ -~]{0,16}", 0..8)) {
            let text: String = vars.iter().map(|(k, v)| format!("{k}={v}\n")).collect();
            proptest::prop_assert_eq!(parse_env(&text), vars);
        }
    }
}
