//! Kubelet's CPU arithmetic: shares and CFS quota from a container's CPU
//! request and limit.

use k8s_cri::v1 as cri;

/// Kubelet's `cm.MinShares`: the shares of a container without a CPU request.
pub const MIN_SHARES: i64 = 2;
/// Kubelet's `cm.MaxShares`.
pub const MAX_SHARES: i64 = 262_144;
/// Kubelet's `cm.SharesPerCPU`.
pub const SHARES_PER_CPU: i64 = 1024;
/// Kubelet's default CFS period (`cm.QuotaPeriod`, microseconds).
pub const QUOTA_PERIOD: i64 = 100_000;
/// Kubelet's `cm.MinQuotaPeriod`: the smallest quota it ever sets.
pub const MIN_QUOTA: i64 = 1000;

/// Kubelet's `MilliCPUToShares`: `max(2, milli*1024/1000)`, capped at 262144;
/// no request (0) means the minimum.
pub fn milli_cpu_to_shares(milli_cpu: i64) -> i64 {
    if milli_cpu <= 0 {
        return MIN_SHARES;
    }
    (milli_cpu.saturating_mul(SHARES_PER_CPU) / 1000).clamp(MIN_SHARES, MAX_SHARES)
}

/// Kubelet's `MilliCPUToQuota`: `milli*period/1000`, at least 1000; no limit
/// (0) means quota 0, which runtimes read as "unlimited".
pub fn milli_cpu_to_quota(milli_cpu: i64, period: i64) -> i64 {
    if milli_cpu <= 0 {
        return 0;
    }
    (milli_cpu.saturating_mul(period) / 1000).max(MIN_QUOTA)
}

/// The CPU part of a container's resources as kubelet computes them
/// (`calculateLinuxResources` with the CFS quota on and the default period):
/// a missing request defaults to the limit; the period is always set.
pub fn kubelet_cpu_resources(
    request_milli: Option<i64>,
    limit_milli: Option<i64>,
) -> cri::LinuxContainerResources {
    let request = request_milli.unwrap_or(0);
    let limit = limit_milli.unwrap_or(0);
    let shares = if request == 0 && limit != 0 {
        milli_cpu_to_shares(limit)
    } else {
        milli_cpu_to_shares(request)
    };
    cri::LinuxContainerResources {
        cpu_shares: shares,
        cpu_period: QUOTA_PERIOD,
        cpu_quota: milli_cpu_to_quota(limit, QUOTA_PERIOD),
        ..Default::default()
    }
}

/// What kubelet sends in CRI `UpdateContainerResources` when it resizes a
/// running container in place (`kuberuntime`'s `updateContainerResources`
/// calls `generateContainerResources`, the same `calculateLinuxResources` as
/// at creation): the new shares, quota and period, and no cpuset. (Only the
/// static CPU manager's reconcile sends `cpuset_cpus`, in an update of its
/// own.)
pub fn kubelet_resize_resources(
    request_milli: Option<i64>,
    limit_milli: Option<i64>,
) -> cri::LinuxContainerResources {
    kubelet_cpu_resources(request_milli, limit_milli)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn shares_match_kubelet() {
        // (milli CPU, expected shares) from kubelet's MilliCPUToShares.
        let table = [
            (0, 2),
            (1, 2),
            (2, 2),
            (3, 3),
            (100, 102),
            (250, 256),
            (1000, 1024),
            (1500, 1536),
            (256_000, 262_144),
            (300_000, 262_144),
        ];
        for (milli, shares) in table {
            assert_eq!(milli_cpu_to_shares(milli), shares, "milli {milli}");
        }
    }

    #[test]
    fn a_resize_sends_the_new_cpu_fields_and_no_cpuset() {
        // (request, limit, shares, quota) as kubelet computes them.
        let table = [
            (None, None, 2, 0),
            (Some(500), None, 512, 0),
            (Some(500), Some(1000), 512, 100_000),
            (None, Some(250), 256, 25_000),
        ];
        for (request, limit, shares, quota) in table {
            let r = kubelet_resize_resources(request, limit);
            assert_eq!(
                (r.cpu_shares, r.cpu_quota, r.cpu_period),
                (shares, quota, QUOTA_PERIOD),
                "{request:?} {limit:?}"
            );
            assert_eq!((r.cpuset_cpus.as_str(), r.cpuset_mems.as_str()), ("", ""));
        }
    }

    #[test]
    fn quota_matches_kubelet() {
        let table = [
            (0, 0),
            (1, 1000),
            (9, 1000),
            (10, 1000),
            (11, 1100),
            (500, 50_000),
            (1000, 100_000),
            (2500, 250_000),
        ];
        for (milli, quota) in table {
            assert_eq!(
                milli_cpu_to_quota(milli, QUOTA_PERIOD),
                quota,
                "milli {milli}"
            );
        }
    }

    #[test]
    fn container_resources_follow_request_and_limit() {
        // (request, limit, shares, quota)
        let table = [
            (None, None, 2, 0),
            (Some(500), None, 512, 0),
            (None, Some(2000), 2048, 200_000),
            (Some(250), Some(1000), 256, 100_000),
            (Some(1000), Some(1000), 1024, 100_000),
        ];
        for (request, limit, shares, quota) in table {
            let r = kubelet_cpu_resources(request, limit);
            assert_eq!(
                (r.cpu_shares, r.cpu_quota, r.cpu_period),
                (shares, quota, QUOTA_PERIOD),
                "request {request:?} limit {limit:?}"
            );
        }
    }

    proptest! {
        #[test]
        fn shares_are_bounded_and_monotonic(a in 0i64..1_000_000, b in 0i64..1_000_000) {
            let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
            let (s_lo, s_hi) = (milli_cpu_to_shares(lo), milli_cpu_to_shares(hi));
            prop_assert!((MIN_SHARES..=MAX_SHARES).contains(&s_lo));
            prop_assert!(s_lo <= s_hi);
            // The design's rule: a request of 3m or more gives shares above 2.
            prop_assert_eq!(milli_cpu_to_shares(hi) > MIN_SHARES, hi >= 3);
        }

        #[test]
        fn quota_is_zero_or_at_least_minimum(milli in 0i64..10_000_000) {
            let quota = milli_cpu_to_quota(milli, QUOTA_PERIOD);
            prop_assert!(quota == 0 || quota >= MIN_QUOTA);
            prop_assert_eq!(quota == 0, milli == 0);
        }
    }
}
