//! A container's CPU weight (v1 `cpu.shares` or v2 `cpu.weight`) and CFS
//! quota (v1 `cpu.cfs_quota_us` or v2 `cpu.max`).

use std::path::PathBuf;

use super::mounts::{cgroup_mounts, parse_proc_cgroup};
use super::{read_to_string, CgroupError};

/// A container's CPU weight as its cgroup holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CpuWeight {
    /// cgroup v1 `cpu.shares`.
    Shares(u64),
    /// cgroup v2 `cpu.weight` (1-10000), which runc derives from the shares.
    Weight(u64),
}

impl CpuWeight {
    /// Whether this is what the runtime writes for `shares` kubelet asked
    /// for. runc before 1.3.2 maps shares to `cpu.weight` linearly, later
    /// versions (and crun 1.23+) by a quadratic in log2(shares) that keeps
    /// the default 1024 at weight 100: both are accepted.
    pub fn matches_shares(self, shares: u64) -> bool {
        match self {
            CpuWeight::Shares(value) => value == shares,
            CpuWeight::Weight(value) => {
                value == shares_to_weight_linear(shares)
                    || value == shares_to_weight_quadratic(shares)
            }
        }
    }
}

/// runc < 1.3.2: `1 + (shares - 2) * 9999 / 262142`, clamped to the ranges.
pub fn shares_to_weight_linear(shares: u64) -> u64 {
    let shares = shares.clamp(2, 262_144);
    1 + ((shares - 2) * 9999) / 262_142
}

/// runc ≥ 1.3.2: `ceil(10^((l² + 125 l) / 612 - 7/34))` with `l = log2(shares)`.
pub fn shares_to_weight_quadratic(shares: u64) -> u64 {
    if shares <= 2 {
        return 1;
    }
    if shares >= 262_144 {
        return 10_000;
    }
    let l = (shares as f64).log2();
    let exponent = (l * l + 125.0 * l) / 612.0 - 7.0 / 34.0;
    10f64.powf(exponent).ceil() as u64
}

/// The directory of process `pid`'s cgroup that holds the `cpu`
/// controller's files, and whether it is a cgroup v2 one.
fn cpu_controller_dir_of(pid: u32) -> Result<(PathBuf, bool), CgroupError> {
    let source = PathBuf::from(format!("/proc/{pid}/cgroup"));
    let entries = parse_proc_cgroup(&read_to_string(&source)?, &source)?;
    let mounts = cgroup_mounts()?;
    let v1_cpu = mounts
        .iter()
        .find(|m| !m.unified && m.controllers.iter().any(|c| c == "cpu"));
    if let Some(mount) = v1_cpu {
        let entry = entries
            .iter()
            .find(|e| e.controllers.iter().any(|c| c == "cpu"))
            .ok_or(CgroupError::NotInHierarchy {
                pid,
                controller: "cpu",
                wanted: "`N:cpu,...:/path`",
            })?;
        return Ok((
            mount.mount_point.join(entry.path.trim_start_matches('/')),
            false,
        ));
    }
    let unified = mounts
        .iter()
        .find(|m| m.unified && m.controllers.iter().any(|c| c == "cpu"))
        .ok_or(CgroupError::NoController { controller: "cpu" })?;
    let entry = entries
        .iter()
        .find(|e| e.hierarchy_id == 0 && e.controllers.is_empty())
        .ok_or(CgroupError::NotInHierarchy {
            pid,
            controller: "cgroup v2",
            wanted: "`0::/path`",
        })?;
    Ok((
        unified.mount_point.join(entry.path.trim_start_matches('/')),
        true,
    ))
}

fn malformed(path: PathBuf, text: &str) -> CgroupError {
    CgroupError::Malformed {
        path,
        line: text.trim().to_string(),
    }
}

/// The CPU weight of process `pid`'s cgroup: `cpu.shares` of its v1 `cpu`
/// hierarchy, or `cpu.weight` of its cgroup v2 directory.
pub fn cpu_weight_of(pid: u32) -> Result<CpuWeight, CgroupError> {
    let (dir, v2) = cpu_controller_dir_of(pid)?;
    let path = dir.join(if v2 { "cpu.weight" } else { "cpu.shares" });
    let text = read_to_string(&path)?;
    let value = text.trim().parse().map_err(|_| malformed(path, &text))?;
    Ok(if v2 {
        CpuWeight::Weight(value)
    } else {
        CpuWeight::Shares(value)
    })
}

/// The CFS quota of process `pid`'s cgroup in microseconds per period:
/// `None` when it has none (v1 `cpu.cfs_quota_us` -1, v2 `cpu.max` `max`).
pub fn cfs_quota_of(pid: u32) -> Result<Option<u64>, CgroupError> {
    let (dir, v2) = cpu_controller_dir_of(pid)?;
    let path = dir.join(if v2 { "cpu.max" } else { "cpu.cfs_quota_us" });
    let text = read_to_string(&path)?;
    let quota = text.split_whitespace().next().unwrap_or_default();
    match quota {
        "max" | "-1" => Ok(None),
        number => number.parse().map(Some).map_err(|_| malformed(path, &text)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_weights_match_either_runc_conversion_of_the_shares() {
        // Values runc writes: linear before 1.3.2, quadratic after.
        let table = [
            (2, 1, 1),
            (102, 4, 17),
            (1024, 39, 100),
            (262_144, 10_000, 10_000),
        ];
        for (shares, linear, quadratic) in table {
            assert_eq!(shares_to_weight_linear(shares), linear, "{shares}");
            assert_eq!(shares_to_weight_quadratic(shares), quadratic, "{shares}");
            assert!(CpuWeight::Weight(linear).matches_shares(shares));
            assert!(CpuWeight::Weight(quadratic).matches_shares(shares));
        }
        assert!(CpuWeight::Shares(102).matches_shares(102));
        assert!(!CpuWeight::Shares(4).matches_shares(102));
        assert!(!CpuWeight::Weight(50).matches_shares(102));
    }
}
