//! The Helm chart's ClusterRole against the API calls dra-plugin makes.
//!
//! The daemon's real run loop is driven against the fake API server through
//! everything that touches the API: publishing its pool (including removing a
//! stale slice), watching its slices, and preparing a claim for kubelet. Every
//! request the server saw is turned into the attributes RBAC authorizes
//! (API group, resource, verb), and each must be allowed by the ClusterRole
//! that `helm template` renders. The other way round too: every permission the
//! role grants must have been used, so the role cannot grow past the code.
//!
//! Needs `helm` (scripts/install-deps.sh installs it; `HELM` overrides the
//! binary).

// A panic in test code is a failed test, not a crash on user input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{eventually, prepare_ok, Node, DRIVER, NODE};
use dra_cpu_tests::apiserver::RequestLine;
use dra_cpu_tests::claims::AllocatedClaim;
use dra_cpu_tests::kubelet_dra::DraVersion;
use dra_plugin::devices::DeviceMode;
use dra_plugin::slices::{build_slices, slice_name};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use std::collections::BTreeSet;

/// What RBAC authorizes for one resource request.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Access {
    group: String,
    resource: String,
    verb: String,
    /// The object's name, where the authorizer is given one that a rule's
    /// `resourceNames` can match.
    name: Option<String>,
}

fn access(group: &str, resource: &str, verb: &str) -> Access {
    Access {
        group: group.into(),
        resource: resource.into(),
        verb: verb.into(),
        name: None,
    }
}

/// The synthetic `resourceclaims/driver` access of a status.devices write,
/// named after the driver.
fn driver_status_access(verb: &str) -> Access {
    Access {
        name: Some(DRIVER.to_string()),
        ..access(
            "resource.k8s.io",
            "resourceclaims/driver",
            &format!("associated-node:{verb}"),
        )
    }
}

/// How the API server's authorizer sees one request.
#[derive(Debug, PartialEq, Eq)]
enum Attributes {
    Resource(Vec<Access>),
    /// Discovery and version paths, open to every authenticated user through
    /// the built-in system:discovery role.
    NonResource(String),
}

/// The RBAC attributes of a request line, following the API server's
/// request-info rules. An apply patch is also authorized as a create, because
/// the server checks create permission when the apply creates the object;
/// not on a subresource (`status`), which an apply cannot create.
fn attributes(request: &RequestLine) -> Result<Attributes, String> {
    let (path, query) = request
        .path
        .split_once('?')
        .unwrap_or((request.path.as_str(), ""));
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let rest = match parts.as_slice() {
        ["api", "v1", rest @ ..] if !rest.is_empty() => (String::new(), rest),
        ["apis", group, _version, rest @ ..] if !rest.is_empty() => (group.to_string(), rest),
        _ => return Ok(Attributes::NonResource(path.to_string())),
    };
    let (group, mut rest) = rest;
    if let ["namespaces", _ns, inner @ ..] = rest {
        if !inner.is_empty() {
            rest = inner;
        }
    }
    let (resource, name, subresource) = match rest {
        [resource] => (resource.to_string(), false, false),
        [resource, _name] => (resource.to_string(), true, false),
        [resource, _name, sub] => (format!("{resource}/{sub}"), true, true),
        _ => return Err(format!("unexpected path {path}")),
    };
    let watch = query
        .split('&')
        .any(|kv| kv == "watch=true" || kv == "watch=1");
    let verbs: &[&str] = match (request.method.as_str(), name, watch) {
        ("GET", _, true) => &["watch"],
        ("GET", true, false) => &["get"],
        ("GET", false, false) => &["list"],
        ("POST", false, _) => &["create"],
        ("PUT", true, _) => &["update"],
        ("PATCH", true, _) if subresource => &["patch"],
        ("PATCH", true, _) => &["patch", "create"],
        ("DELETE", true, _) => &["delete"],
        ("DELETE", false, _) => &["deletecollection"],
        (method, _, _) => return Err(format!("unexpected request {method} {path}")),
    };
    let mut accesses: Vec<Access> = verbs
        .iter()
        .map(|verb| access(&group, &resource, verb))
        .collect();
    // A write of a claim's status that changes status.devices (every status
    // write dra-plugin makes does) is also authorized, from Kubernetes 1.36
    // (DRAResourceClaimGranularStatusAuthorization), against the synthetic
    // resource resourceclaims/driver named after the driver, with the verb
    // prefixed by associated-node: when the writer's token is bound to the
    // claim's node (k8s.io/kubernetes pkg/registry/resource/utils.go).
    if group == "resource.k8s.io" && resource == "resourceclaims/status" {
        accesses.extend(verbs.iter().map(|verb| driver_status_access(verb)));
    }
    Ok(Attributes::Resource(accesses))
}

/// Paths the built-in system:discovery and system:public-info-viewer roles
/// open to every client.
fn is_public_path(path: &str) -> bool {
    let path = path.trim_end_matches('/');
    [
        "/api", "/apis", "/version", "/openapi", "/healthz", "/livez", "/readyz",
    ]
    .iter()
    .any(|open| path == *open || path.starts_with(&format!("{open}/")))
}

/// One ClusterRole rule, as rendered.
#[derive(Debug, Clone, PartialEq)]
struct Rule {
    groups: Vec<String>,
    resources: Vec<String>,
    verbs: Vec<String>,
    /// `resourceNames`; empty means any object.
    names: Vec<String>,
}

impl Rule {
    fn allows(&self, a: &Access) -> bool {
        let has = |list: &[String], want: &str| list.iter().any(|x| x == "*" || x == want);
        has(&self.groups, &a.group)
            && has(&self.resources, &a.resource)
            && has(&self.verbs, &a.verb)
            && (self.names.is_empty() || a.name.as_ref().is_some_and(|n| self.names.contains(n)))
    }

    /// Every (group, resource, verb) the rule grants; wildcards stay as `*`.
    fn grants(&self) -> Vec<Access> {
        let mut all = Vec::new();
        for g in &self.groups {
            for r in &self.resources {
                for v in &self.verbs {
                    if self.names.is_empty() {
                        all.push(access(g, r, v));
                    }
                    for n in &self.names {
                        all.push(Access {
                            name: Some(n.clone()),
                            ..access(g, r, v)
                        });
                    }
                }
            }
        }
        all
    }
}

fn strings(value: &serde_json::Value, key: &str) -> Vec<String> {
    value
        .get(key)
        .and_then(serde_json::Value::as_array)
        .map(|items| {
            items
                .iter()
                .filter_map(|i| i.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// The rules of the ClusterRole the chart renders with its default values.
fn rendered_rules() -> Vec<Rule> {
    let text = dra_cpu_tests::chart::template(
        "rbac-check",
        &[
            "--show-only".as_ref(),
            "templates/clusterrole.yaml".as_ref(),
        ],
    );
    let role: serde_json::Value =
        serde_saphyr::from_str(&text).expect("rendered ClusterRole is YAML");
    assert_eq!(
        role.get("kind").and_then(|k| k.as_str()),
        Some("ClusterRole")
    );
    let rules = role
        .get("rules")
        .and_then(serde_json::Value::as_array)
        .expect("ClusterRole has rules");
    rules
        .iter()
        .map(|r| {
            assert!(
                r.get("nonResourceURLs").is_none(),
                "rule forms this check does not read: {r:?}"
            );
            Rule {
                groups: strings(r, "apiGroups"),
                resources: strings(r, "resources"),
                verbs: strings(r, "verbs"),
                names: strings(r, "resourceNames"),
            }
        })
        .collect()
}

/// A claim allocated one share of NUMA node 0's CPUs, reserved for a pod.
fn allocated_claim(name: &str) -> ResourceClaim {
    AllocatedClaim::new("team-a", name, NODE, "cpudevnuma000", 2)
        .empty_spec()
        .reserved_for("pod-a", "0000000a-0000-4000-8000-000000000000")
        .build()
}

#[tokio::test]
async fn rendered_cluster_role_covers_exactly_the_calls_dra_plugin_makes() {
    let rules = rendered_rules();
    let node = Node::new(DeviceMode::Grouped);
    let api = &node.api;

    // A slice of ours the pool no longer has, so the daemon deletes one.
    let stale = slice_name(NODE, DRIVER, 7);
    let mut slice: ResourceSlice = build_slices(DRIVER, NODE, None, Vec::new(), 1)
        .expect("slice")
        .remove(0);
    slice.metadata.name = Some(stale.clone());
    let setup = api.client().await.expect("client");
    kube::Api::<ResourceSlice>::all(setup)
        .create(&Default::default(), &slice)
        .await
        .expect("stale slice");
    let claim = api.insert_claim(allocated_claim("cpus")).expect("claim");
    let before = api.requests().len();

    let running = node.start(DraVersion::V1).await;
    let claim_ref = dra_cpu_tests::kubelet_dra::Claim {
        namespace: "team-a".into(),
        name: "cpus".into(),
        uid: claim.metadata.uid.clone().expect("uid"),
    };
    prepare_ok(&running.kubelet, &claim_ref).await;
    running
        .kubelet
        .unprepare(std::slice::from_ref(&claim_ref))
        .await
        .expect("unprepare");

    eventually("the stale slice is deleted and the pool published", || {
        let names: Vec<String> = api
            .slices()
            .into_iter()
            .filter_map(|s| s.metadata.name)
            .collect();
        !names.contains(&stale) && names.contains(&slice_name(NODE, DRIVER, 0))
    })
    .await;
    eventually("the claim's device status is written and cleared", || {
        api.requests()[before..]
            .iter()
            .filter(|r| r.method == "PATCH" && r.path.contains("/resourceclaims/cpus/status"))
            .count()
            >= 2
    })
    .await;
    eventually("the daemon watches its slices", || {
        api.requests()[before..]
            .iter()
            .any(|r| r.method == "GET" && r.path.contains("watch=true"))
    })
    .await;
    running.stop().await.expect("daemon ran cleanly");

    let requests = api.requests()[before..].to_vec();
    let mut used = BTreeSet::new();
    let mut denied = Vec::new();
    for request in &requests {
        match attributes(request).unwrap_or_else(|e| panic!("{e}")) {
            Attributes::NonResource(path) => {
                assert!(
                    is_public_path(&path),
                    "non-resource request {request:?} needs a rule"
                );
            }
            Attributes::Resource(accesses) => {
                for a in accesses {
                    if !rules.iter().any(|r| r.allows(&a)) {
                        denied.push(format!("{} {} -> {a:?}", request.method, request.path));
                    }
                    used.insert(a);
                }
            }
        }
    }
    assert!(
        denied.is_empty(),
        "the chart's ClusterRole denies calls dra-plugin makes:\n{}",
        denied.join("\n")
    );
    let granted: BTreeSet<Access> = rules.iter().flat_map(Rule::grants).collect();
    let unused: Vec<&Access> = granted.difference(&used).collect();
    assert!(
        unused.is_empty(),
        "the chart's ClusterRole grants what dra-plugin never calls: {unused:?}"
    );
    // The calls this test exists for happened.
    for wanted in [
        access("", "nodes", "get"),
        access("resource.k8s.io", "resourceclaims", "get"),
        access("resource.k8s.io", "resourceslices", "list"),
        access("resource.k8s.io", "resourceslices", "watch"),
        access("resource.k8s.io", "resourceslices", "patch"),
        access("resource.k8s.io", "resourceslices", "delete"),
        driver_status_access("patch"),
    ] {
        assert!(used.contains(&wanted), "dra-plugin never made {wanted:?}");
    }
}

#[test]
fn request_attributes_table() {
    let line = |method: &str, path: &str| RequestLine {
        method: method.into(),
        path: path.into(),
    };
    let one = |g: &str, r: &str, v: &str| Attributes::Resource(vec![access(g, r, v)]);
    let cases = [
        (line("GET", "/api/v1/nodes/node-a"), one("", "nodes", "get")),
        (
            line(
                "GET",
                "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c",
            ),
            one("resource.k8s.io", "resourceclaims", "get"),
        ),
        (
            line(
                "GET",
                "/apis/resource.k8s.io/v1/resourceslices?labelSelector=a%3Db",
            ),
            one("resource.k8s.io", "resourceslices", "list"),
        ),
        (
            line(
                "GET",
                "/apis/resource.k8s.io/v1/resourceslices?watch=true&resourceVersion=5",
            ),
            one("resource.k8s.io", "resourceslices", "watch"),
        ),
        (
            line(
                "PATCH",
                "/apis/resource.k8s.io/v1/resourceslices/s?fieldManager=dra.cpu",
            ),
            Attributes::Resource(vec![
                access("resource.k8s.io", "resourceslices", "patch"),
                access("resource.k8s.io", "resourceslices", "create"),
            ]),
        ),
        (
            line("DELETE", "/apis/resource.k8s.io/v1/resourceslices/s"),
            one("resource.k8s.io", "resourceslices", "delete"),
        ),
        (
            line("DELETE", "/apis/resource.k8s.io/v1/resourceslices"),
            one("resource.k8s.io", "resourceslices", "deletecollection"),
        ),
        (
            line(
                "PUT",
                "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c/status",
            ),
            Attributes::Resource(vec![
                access("resource.k8s.io", "resourceclaims/status", "update"),
                driver_status_access("update"),
            ]),
        ),
        (
            line("POST", "/api/v1/namespaces/ns/events"),
            one("", "events", "create"),
        ),
        (
            line("GET", "/api/v1/namespaces/kube-system"),
            one("", "namespaces", "get"),
        ),
        (
            line("GET", "/version"),
            Attributes::NonResource("/version".into()),
        ),
        (
            line("GET", "/apis"),
            Attributes::NonResource("/apis".into()),
        ),
    ];
    for (request, want) in cases {
        assert_eq!(attributes(&request), Ok(want), "{request:?}");
    }
    assert!(attributes(&line("PATCH", "/apis/resource.k8s.io/v1/resourceslices")).is_err());
    assert!(is_public_path("/version") && is_public_path("/apis/resource.k8s.io/v1"));
    assert!(!is_public_path("/metrics") && !is_public_path("/versions"));
}

#[test]
fn rules_allow_by_group_resource_and_verb() {
    let rule = Rule {
        groups: vec!["resource.k8s.io".into()],
        resources: vec!["resourceslices".into()],
        verbs: vec!["list".into(), "watch".into()],
        names: Vec::new(),
    };
    assert!(rule.allows(&access("resource.k8s.io", "resourceslices", "list")));
    assert!(!rule.allows(&access("resource.k8s.io", "resourceslices", "delete")));
    assert!(!rule.allows(&access("", "resourceslices", "list")));
    assert!(!rule.allows(&access("resource.k8s.io", "resourceclaims", "list")));
    let wide = Rule {
        groups: vec!["*".into()],
        resources: vec!["*".into()],
        verbs: vec!["get".into()],
        names: Vec::new(),
    };
    assert!(wide.allows(&access("apps", "daemonsets", "get")));
    assert_eq!(rule.grants().len(), 2);
    // resourceNames: only the named object.
    let named = Rule {
        groups: vec!["resource.k8s.io".into()],
        resources: vec!["resourceclaims/driver".into()],
        verbs: vec!["associated-node:patch".into()],
        names: vec![DRIVER.into()],
    };
    assert!(named.allows(&driver_status_access("patch")));
    assert!(!named.allows(&driver_status_access("update")));
    let other = Access {
        name: Some("other.driver".into()),
        ..driver_status_access("patch")
    };
    assert!(!named.allows(&other));
    assert!(!named.allows(&access(
        "resource.k8s.io",
        "resourceclaims/driver",
        "associated-node:patch"
    )));
    assert_eq!(named.grants(), vec![driver_status_access("patch")]);
}
