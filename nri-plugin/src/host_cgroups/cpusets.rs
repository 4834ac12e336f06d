//! The cpuset decisions of `--host-cgroups`, as plain functions: the
//! cpuset a host cgroup gets, when it needs a write, when a value was
//! changed behind nri-plugin's back, and how a refused restore is retried.

use std::io;

use shared_state::CpuSet;

/// The cpuset every host cgroup gets: the shared pool and the reserved CPUs.
/// `None` when that is empty (every CPU claimed, none reserved): an empty
/// `cpuset.cpus` would mean "the parent's CPUs", the opposite of what is
/// wanted, so the cgroups keep their last value.
pub fn host_cpuset(shared: &CpuSet, reserved: &CpuSet) -> Option<CpuSet> {
    let want = shared.union(reserved);
    (!want.is_empty()).then_some(want)
}

/// Whether a cgroup needs a write: anything but the cpuset last written
/// successfully (a failed write left `last` unchanged, so it is retried).
pub fn needs_write(last: Option<&CpuSet>, want: &CpuSet) -> bool {
    last != Some(want)
}

/// Whether a cgroup's `cpuset.cpus` (as read) was changed behind
/// nri-plugin's back since it wrote `last`: systemd rewrites it from a
/// unit's `AllowedCPUs=` (empty when unset) when it re-applies the unit's
/// cgroup settings (daemon-reload, set-property). Nothing written yet, or
/// a file that does not parse, is not drift.
pub fn drifted(read: &str, last: Option<&CpuSet>) -> bool {
    match (last, CpuSet::parse_cpulist(read.trim())) {
        (Some(last), Ok(now)) => &now != last,
        (Some(_), Err(_)) | (None, _) => false,
    }
}

/// Whether `cgroup.subtree_control` text lists the cpuset controller.
pub fn lists_cpuset(controllers: &str) -> bool {
    controllers.split_whitespace().any(|c| c == "cpuset")
}

/// Whether a refused restore of an empty `cpuset.cpus` should write the
/// parent's effective CPUs instead. Kernels before the cgroup v1/v2 split
/// of cpuset's `validate_change` (6.12 among them) refuse to empty the
/// `cpuset.cpus` of a cgroup that holds processes, with ENOSPC, on v2 too.
/// The parent's effective CPUs are what the empty value gave the cgroup;
/// they only stop following CPU hotplug.
pub fn use_parent_instead_of_empty(original: &str, error: &io::Error) -> bool {
    original.trim().is_empty() && error.kind() == io::ErrorKind::StorageFull
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(s: &str) -> CpuSet {
        CpuSet::parse_cpulist(s).expect("cpulist")
    }

    #[test]
    fn host_cpuset_table() {
        // (shared pool, reserved, host cgroups get)
        let cases = [
            ("0-7", "", Some("0-7")),
            ("2-7", "0-1", Some("0-7")),
            ("4-7", "0", Some("0,4-7")),
            ("", "0", Some("0")),
            ("3", "", Some("3")),
            ("", "", None),
        ];
        for (shared, reserved, want) in cases {
            assert_eq!(
                host_cpuset(&set(shared), &set(reserved)),
                want.map(set),
                "shared {shared:?} reserved {reserved:?}"
            );
        }
    }

    #[test]
    fn needs_write_table() {
        let cases = [
            (None, "0-3", true),
            (Some("0-3"), "0-3", false),
            (Some("0-3"), "0-2", true),
            (Some("0-2"), "0-3", true),
        ];
        for (last, want, write) in cases {
            let last = last.map(set);
            assert_eq!(
                needs_write(last.as_ref(), &set(want)),
                write,
                "{last:?} {want}"
            );
        }
    }

    #[test]
    fn empty_restore_falls_back_only_when_the_kernel_refuses_it() {
        let enospc = || io::Error::from_raw_os_error(libc::ENOSPC);
        let cases = [
            ("", enospc(), true),
            ("  ", enospc(), true),
            ("0-3", enospc(), false),
            ("", io::Error::from_raw_os_error(libc::EACCES), false),
            ("", io::Error::from_raw_os_error(libc::ENOENT), false),
        ];
        for (original, error, fallback) in cases {
            assert_eq!(
                use_parent_instead_of_empty(original, &error),
                fallback,
                "{original:?} {error}"
            );
        }
    }

    #[test]
    fn drift_table() {
        let cases = [
            ("0-3\n", Some("0-3"), false),
            ("0,1,2,3", Some("0-3"), false),
            ("\n", Some("0-3"), true),
            ("0-7\n", Some("0-3"), true),
            ("0-7\n", None, false),
            ("garbage", Some("0-3"), false),
        ];
        for (read, last, drift) in cases {
            let last = last.map(set);
            assert_eq!(drifted(read, last.as_ref()), drift, "{read:?} {last:?}");
        }
    }

    #[test]
    fn lists_cpuset_table() {
        for (text, has) in [
            ("cpuset cpu io memory pids\n", true),
            ("cpu memory", false),
            ("", false),
            ("cpuset", true),
            ("cpusetx", false),
        ] {
            assert_eq!(lists_cpuset(text), has, "{text:?}");
        }
    }
}
