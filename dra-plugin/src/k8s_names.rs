//! Kubernetes name rules this driver checks before it uses a name: in slice
//! names, socket names and the driver field of its objects.

/// A part of a DNS-1123 subdomain between dots, as the API server's
/// `IsDNS1123Subdomain` matches it: lower-case letters, digits and `-`,
/// neither first nor last; its pattern puts no length on a part (only on
/// the whole name), so neither does this.
fn is_dns_part(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// `IsDNS1123Subdomain` of apimachinery: node and object names (at most
/// 253 bytes).
pub fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns_part)
}

/// `IsDNS1123Label`: namespace names (at most 63 bytes, no dots).
pub fn is_dns_label(s: &str) -> bool {
    s.len() <= 63 && is_dns_part(s)
}

/// A DRA driver name: a DNS subdomain of at most 63 bytes, the limit the
/// API server puts on `spec.driver` of ResourceSlices and DeviceClasses
/// (`resource.DriverNameMaxLength`); it also keeps the socket names under
/// the kubelet's plugin directories short.
pub fn is_driver_name(s: &str) -> bool {
    s.len() <= 63 && is_dns_subdomain(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_api_servers_rules() {
        let cases = [
            ("dra.cpu", true, true),
            ("a", true, true),
            ("cpu-1.example.com", true, true),
            ("", false, false),
            ("Dra.cpu", false, false),
            ("dra..cpu", false, false),
            ("-dra", false, false),
            ("dra-", false, false),
            ("dra_cpu", false, false),
            ("dra/cpu", false, false),
        ];
        for (name, subdomain, driver) in cases {
            assert_eq!(is_dns_subdomain(name), subdomain, "{name:?}");
            assert_eq!(is_driver_name(name), driver, "{name:?}");
        }
        let long_label = "a".repeat(64);
        assert!(is_dns_subdomain(&long_label));
        assert!(!is_driver_name(&long_label));
        assert!(is_driver_name(&"a".repeat(63)));
        assert!(is_dns_label("kube-system") && is_dns_label(&"a".repeat(63)));
        assert!(!is_dns_label(&long_label) && !is_dns_label("a.b") && !is_dns_label("-a"));
        let node = [
            "a".repeat(63),
            "b".repeat(63),
            "c".repeat(63),
            "d".repeat(61),
        ]
        .join(".");
        assert_eq!(node.len(), 253);
        assert!(is_dns_subdomain(&node));
        assert!(!is_dns_subdomain(&format!("{node}e")));
    }
}
