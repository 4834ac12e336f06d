//! Wire compatibility of the kubelet and coordination bindings: hand-encoded
//! bytes built from the upstream field numbers, round trips, and a comparison
//! of our protocol files with the upstream ones compiled by protoc.

// A panic in test code is a failed test, not a crash on user input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::BTreeMap;

use dra_cpu_proto::coordination::{self, v1 as coord};
use dra_cpu_proto::kubelet::{self, dra_v1, dra_v1beta1, health_v1, health_v1alpha1, registration};
use prost::Message;
use prost_types::FileDescriptorSet;
use support::kubelet::dra_plugin_info;
use support::reference::{
    compile_reference, field_type, rpc_signature, Upstream, DRA_HEALTH_V1, DRA_V1,
    PLUGIN_REGISTRATION_V1,
};

/// A length-delimited field (wire type 2) encoded by hand.
fn len_field(number: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = varint(u64::from(number << 3 | 2));
    out.extend(varint(payload.len() as u64));
    out.extend_from_slice(payload);
    out
}

/// A varint field (wire type 0) encoded by hand.
fn varint_field(number: u32, value: u64) -> Vec<u8> {
    let mut out = varint(u64::from(number << 3));
    out.extend(varint(value));
    out
}

fn varint(mut value: u64) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let byte = (value & 0x7f) as u8;
        value >>= 7;
        if value == 0 {
            out.push(byte);
            return out;
        }
        out.push(byte | 0x80);
    }
}

fn concat(parts: &[Vec<u8>]) -> Vec<u8> {
    parts.concat()
}

#[test]
fn hand_encoder_matches_known_bytes() {
    // Guards the helpers themselves: field 1 "ns" and field 2 = 300.
    assert_eq!(len_field(1, b"ns"), vec![0x0a, 0x02, b'n', b's']);
    assert_eq!(varint_field(2, 300), vec![0x10, 0xac, 0x02]);
}

/// Claim{namespace=1, uid=2, name=3} inside NodePrepareResourcesRequest.claims=1.
fn expected_claim_request() -> Vec<u8> {
    let claim = concat(&[
        len_field(1, b"default"),
        len_field(2, b"6f1c-uid"),
        len_field(3, b"cpu-claim"),
    ]);
    len_field(1, &claim)
}

#[test]
fn dra_v1_prepare_request_wire_bytes() {
    let request = dra_v1::NodePrepareResourcesRequest {
        claims: vec![dra_v1::Claim {
            namespace: "default".into(),
            uid: "6f1c-uid".into(),
            name: "cpu-claim".into(),
        }],
    };
    let bytes = request.encode_to_vec();
    assert_eq!(bytes, expected_claim_request());
    assert_eq!(
        dra_v1::NodePrepareResourcesRequest::decode(bytes.as_slice()).unwrap(),
        request
    );
    // The unprepare request has the same shape.
    let unprepare = dra_v1::NodeUnprepareResourcesRequest {
        claims: request.claims.clone(),
    };
    assert_eq!(unprepare.encode_to_vec(), expected_claim_request());
}

#[test]
fn dra_v1beta1_prepare_request_wire_bytes() {
    let request = dra_v1beta1::NodePrepareResourcesRequest {
        claims: vec![dra_v1beta1::Claim {
            namespace: "default".into(),
            uid: "6f1c-uid".into(),
            name: "cpu-claim".into(),
        }],
    };
    assert_eq!(request.encode_to_vec(), expected_claim_request());
}

#[test]
fn dra_v1_prepare_response_wire_bytes() {
    let device = dra_v1::Device {
        request_names: vec!["cpus".into()],
        pool_name: "node-a".into(),
        device_name: "cpudevnuma000".into(),
        cdi_device_ids: vec!["dra.k8s.io/cpu=claim-u1".into()],
        share_id: Some("s1".into()),
    };
    let response = dra_v1::NodePrepareResourcesResponse {
        claims: [(
            "u1".to_string(),
            dra_v1::NodePrepareResourceResponse {
                devices: vec![device],
                error: String::new(),
            },
        )]
        .into(),
    };
    let device_bytes = concat(&[
        len_field(1, b"cpus"),
        len_field(2, b"node-a"),
        len_field(3, b"cpudevnuma000"),
        len_field(4, b"dra.k8s.io/cpu=claim-u1"),
        len_field(5, b"s1"),
    ]);
    let entry_value = len_field(1, &device_bytes);
    // A map entry is a message {key = 1, value = 2}.
    let entry = concat(&[len_field(1, b"u1"), len_field(2, &entry_value)]);
    assert_eq!(response.encode_to_vec(), len_field(1, &entry));

    let failed = dra_v1::NodeUnprepareResourcesResponse {
        claims: [(
            "u2".to_string(),
            dra_v1::NodeUnprepareResourceResponse {
                error: "boom".into(),
            },
        )]
        .into(),
    };
    let entry = concat(&[len_field(1, b"u2"), len_field(2, &len_field(1, b"boom"))]);
    assert_eq!(failed.encode_to_vec(), len_field(1, &entry));
}

#[test]
fn v1beta1_device_decodes_v1_bytes_without_share_id() {
    // A v1 device with share_id read by a v1beta1 peer keeps the other fields.
    let v1 = dra_v1::Device {
        request_names: vec![],
        pool_name: "p".into(),
        device_name: "d".into(),
        cdi_device_ids: vec!["x=y".into()],
        share_id: Some("s".into()),
    };
    let beta = dra_v1beta1::Device::decode(v1.encode_to_vec().as_slice()).unwrap();
    assert_eq!(beta.pool_name, "p");
    assert_eq!(beta.device_name, "d");
    assert_eq!(beta.cdi_device_ids, vec!["x=y".to_string()]);
}

#[test]
fn plugin_info_wire_bytes() {
    let info = dra_plugin_info();
    let expected = concat(&[
        len_field(1, b"DRAPlugin"),
        len_field(2, b"dra.cpu"),
        len_field(3, b"/var/lib/kubelet/plugins/dra.cpu/dra.sock"),
        len_field(4, b"v1.DRAPlugin"),
        len_field(4, b"v1beta1.DRAPlugin"),
    ]);
    assert_eq!(info.encode_to_vec(), expected);
    assert_eq!(
        registration::PluginInfo::decode(expected.as_slice()).unwrap(),
        info
    );

    let status = registration::RegistrationStatus {
        plugin_registered: true,
        error: "e".into(),
    };
    assert_eq!(
        status.encode_to_vec(),
        concat(&[varint_field(1, 1), len_field(2, b"e")])
    );
}

#[test]
fn health_wire_bytes() {
    let v1 = health_v1::NodeWatchResourcesResponse {
        devices: vec![health_v1::DeviceHealth {
            device: Some(health_v1::DeviceIdentifier {
                pool_name: "node-a".into(),
                device_name: "cpudev001".into(),
            }),
            health: health_v1::HealthStatus::Unhealthy as i32,
            last_updated_time: 1_700_000_000,
            health_check_timeout_seconds: 30,
            message: "offline".into(),
        }],
    };
    let id = concat(&[len_field(1, b"node-a"), len_field(2, b"cpudev001")]);
    let device = concat(&[
        len_field(1, &id),
        varint_field(2, 2),
        varint_field(3, 1_700_000_000),
        varint_field(4, 30),
        len_field(5, b"offline"),
    ]);
    assert_eq!(v1.encode_to_vec(), len_field(1, &device));

    let alpha = health_v1alpha1::NodeWatchResourcesResponse {
        devices: vec![health_v1alpha1::DeviceHealth {
            device: Some(health_v1alpha1::DeviceIdentifier {
                pool_name: "node-a".into(),
                device_name: "cpudev001".into(),
            }),
            health: health_v1alpha1::HealthStatus::Healthy as i32,
            last_updated_time: 5,
            health_check_timeout_seconds: 30,
            message: "ok".into(),
        }],
    };
    let device = concat(&[
        len_field(1, &id),
        varint_field(2, 1),
        varint_field(3, 5),
        varint_field(4, 30),
        len_field(5, b"ok"),
    ]);
    assert_eq!(alpha.encode_to_vec(), len_field(1, &device));
}

fn sample_claim() -> coord::Claim {
    coord::Claim {
        uid: "u1".into(),
        namespace: "team".into(),
        name: "c1".into(),
        consumer_pod_uids: vec!["pod-1".into()],
        cpus: "2-3".into(),
        tuning: None,
        prepared_at_unix_ms: 1_733_000_000_000,
    }
}

fn sample_claim_bytes() -> Vec<u8> {
    concat(&[
        len_field(1, b"u1"),
        len_field(2, b"team"),
        len_field(3, b"c1"),
        len_field(4, b"pod-1"),
        len_field(5, b"2-3"),
        varint_field(6, 1_733_000_000_000),
    ])
}

#[test]
fn coordination_event_wire_bytes() {
    use coord::watch_event::Event;
    let cases: Vec<(coord::WatchEvent, Vec<u8>)> = vec![
        (
            coord::WatchEvent {
                event: Some(Event::Snapshot(coord::Snapshot {
                    revision: 9,
                    allocatable: "1-7".into(),
                    reserved: "0".into(),
                    mixed_allocation_mode: true,
                    claims: vec![sample_claim()],
                })),
            },
            len_field(
                1,
                &concat(&[
                    varint_field(1, 9),
                    len_field(2, b"1-7"),
                    len_field(3, b"0"),
                    varint_field(4, 1),
                    len_field(5, &sample_claim_bytes()),
                ]),
            ),
        ),
        (
            coord::WatchEvent {
                event: Some(Event::ClaimPrepared(coord::ClaimPrepared {
                    revision: 10,
                    claim: Some(sample_claim()),
                })),
            },
            len_field(
                2,
                &concat(&[varint_field(1, 10), len_field(2, &sample_claim_bytes())]),
            ),
        ),
        (
            coord::WatchEvent {
                event: Some(Event::ClaimUnprepared(coord::ClaimUnprepared {
                    revision: 11,
                    claim_uid: "u1".into(),
                })),
            },
            len_field(3, &concat(&[varint_field(1, 11), len_field(2, b"u1")])),
        ),
        (
            coord::WatchEvent {
                event: Some(Event::Heartbeat(coord::Heartbeat { revision: 11 })),
            },
            len_field(4, &varint_field(1, 11)),
        ),
    ];
    for (event, expected) in cases {
        assert_eq!(event.encode_to_vec(), expected, "{event:?}");
        assert_eq!(
            coord::WatchEvent::decode(expected.as_slice()).unwrap(),
            event
        );
    }
}

#[test]
fn coordination_unary_wire_bytes() {
    let watch = coord::WatchRequest {
        from_revision: 4,
        subscriber: "nri-plugin/n1".into(),
    };
    assert_eq!(
        watch.encode_to_vec(),
        concat(&[varint_field(1, 4), len_field(2, b"nri-plugin/n1")])
    );
    let lookup = coord::LookupRequest {
        claim_uid: "u1".into(),
        pod_uid: String::new(),
    };
    assert_eq!(lookup.encode_to_vec(), len_field(1, b"u1"));
    let found = coord::LookupResponse {
        found: true,
        claim: Some(sample_claim()),
        revision: 3,
    };
    assert_eq!(
        found.encode_to_vec(),
        concat(&[
            varint_field(1, 1),
            len_field(2, &sample_claim_bytes()),
            varint_field(3, 3)
        ])
    );
    let applied = coord::AppliedRevision {
        subscriber: "s".into(),
        revision: 12,
    };
    assert_eq!(
        applied.encode_to_vec(),
        concat(&[len_field(1, b"s"), varint_field(2, 12)])
    );
    let ack = coord::AppliedAck {
        current_revision: 13,
    };
    assert_eq!(ack.encode_to_vec(), varint_field(1, 13));
}

#[test]
fn truncated_event_is_a_decode_error() {
    let bytes = coord::WatchEvent {
        event: Some(coord::watch_event::Event::ClaimPrepared(
            coord::ClaimPrepared {
                revision: 1,
                claim: Some(sample_claim()),
            },
        )),
    }
    .encode_to_vec();
    for cut in 1..bytes.len() {
        assert!(
            coord::WatchEvent::decode(&bytes[..cut]).is_err(),
            "prefix of {cut} bytes decoded"
        );
    }
}

#[test]
fn service_names_are_the_kubelet_ones() {
    let cases = [
        (
            dra_v1::dra_plugin_server::SERVICE_NAME,
            "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin",
        ),
        (
            dra_v1beta1::dra_plugin_server::SERVICE_NAME,
            "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin",
        ),
        (
            registration::registration_server::SERVICE_NAME,
            "pluginregistration.Registration",
        ),
        (
            health_v1alpha1::dra_resource_health_server::SERVICE_NAME,
            "v1alpha1.DRAResourceHealth",
        ),
        (
            health_v1::dra_resource_health_server::SERVICE_NAME,
            "v1.DRAResourceHealth",
        ),
        (
            coord::coordination_server::SERVICE_NAME,
            "dracpu.v1.Coordination",
        ),
    ];
    for (got, want) in cases {
        assert_eq!(got, want);
    }
}

// ---- schema comparison with the upstream protocol files ----

/// A message or service flattened to comparable lines, keyed by full name.
type Schema = BTreeMap<String, Vec<String>>;

fn schema_of(set: &FileDescriptorSet) -> Schema {
    let mut schema = Schema::new();
    for file in &set.file {
        let package = file.package();
        for message in &file.message_type {
            flatten_message(&format!(".{package}"), message, &mut schema);
        }
        for service in &file.service {
            let lines = service
                .method
                .iter()
                .map(|m| format!("rpc {}{}", m.name(), rpc_signature(m)))
                .collect();
            schema.insert(format!(".{package}.{}", service.name()), lines);
        }
        for enumeration in &file.enum_type {
            let lines = enumeration
                .value
                .iter()
                .map(|v| format!("{} = {}", v.name(), v.number()))
                .collect();
            schema.insert(format!(".{package}.{}", enumeration.name()), lines);
        }
    }
    schema
}

fn flatten_message(scope: &str, message: &prost_types::DescriptorProto, schema: &mut Schema) {
    let name = format!("{scope}.{}", message.name());
    let lines = message
        .field
        .iter()
        .map(|f| format!("{} {} = {}", field_type(f), f.name(), f.number()))
        .collect();
    schema.insert(name.clone(), lines);
    for nested in &message.nested_type {
        flatten_message(&name, nested, schema);
    }
}

/// Compiles an upstream protocol file with the vendored protoc.
fn compile_upstream(file: &Upstream) -> Schema {
    schema_of(&compile_reference(file))
}

fn ours() -> Schema {
    schema_of(&FileDescriptorSet::decode(kubelet::FILE_DESCRIPTOR_SET).unwrap())
}

/// Our entries under `package`, renamed as if they were in `as_package`.
fn ours_in(package: &str, as_package: &str) -> Schema {
    let from = format!(".{package}.");
    let to = format!(".{as_package}.");
    ours()
        .into_iter()
        .filter(|(name, _)| name.starts_with(&from))
        .map(|(name, lines)| {
            let rename = |s: &str| s.replace(&from, &to);
            (rename(&name), lines.iter().map(|l| rename(l)).collect())
        })
        .collect()
}

#[test]
fn dra_v1_matches_upstream() {
    let package = "k8s.io.kubelet.pkg.apis.dra.v1";
    let reference = compile_upstream(&DRA_V1);
    assert!(reference.contains_key(&format!(".{package}.DRAPlugin")));
    assert_eq!(ours_in(package, package), reference);
}

#[test]
fn dra_v1beta1_is_v1_without_share_id() {
    let reference: Schema = compile_upstream(&DRA_V1)
        .into_iter()
        .map(|(name, lines)| {
            let lines = lines
                .into_iter()
                .filter(|l| !l.contains(" share_id = 5"))
                .collect();
            (name, lines)
        })
        .collect();
    assert_eq!(
        ours_in(
            "k8s.io.kubelet.pkg.apis.dra.v1beta1",
            "k8s.io.kubelet.pkg.apis.dra.v1"
        ),
        reference
    );
}

#[test]
fn registration_matches_upstream() {
    let reference = compile_upstream(&PLUGIN_REGISTRATION_V1);
    assert!(reference.contains_key(".pluginregistration.Registration"));
    assert_eq!(
        ours_in("pluginregistration", "pluginregistration"),
        reference
    );
}

#[test]
fn health_v1_matches_upstream() {
    let reference = compile_upstream(&DRA_HEALTH_V1);
    assert!(reference.contains_key(".v1.DRAResourceHealth"));
    assert_eq!(ours_in("v1", "v1"), reference);
}

/// v1alpha1's messages gained v1's `health_check_timeout_seconds` (4) and
/// `message` (5) in Kubernetes 1.35: the two APIs differ only in package.
#[test]
fn health_v1alpha1_is_v1_under_another_package() {
    let reference = compile_upstream(&DRA_HEALTH_V1);
    assert_eq!(ours_in("v1alpha1", "v1"), reference);
}

#[test]
fn coordination_descriptor_lists_every_message() {
    let schema = schema_of(&FileDescriptorSet::decode(coordination::FILE_DESCRIPTOR_SET).unwrap());
    for name in [
        "Coordination",
        "WatchRequest",
        "WatchEvent",
        "Snapshot",
        "ClaimPrepared",
        "ClaimUnprepared",
        "Heartbeat",
        "Claim",
        "LookupRequest",
        "LookupResponse",
        "AppliedRevision",
        "AppliedAck",
    ] {
        assert!(
            schema.contains_key(&format!(".dracpu.v1.{name}")),
            "{name} missing"
        );
    }
    assert_eq!(
        schema[".dracpu.v1.Coordination"][0],
        "rpc Watch(.dracpu.v1.WatchRequest) returns (stream .dracpu.v1.WatchEvent)"
    );
}
