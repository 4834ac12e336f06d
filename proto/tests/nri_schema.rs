//! Conformance of our NRI protocol (`proto/nri/api.proto`, as compiled into
//! the bindings) with the upstream NRI protocol, `pkg/api/api.proto` of the
//! Go module `github.com/containerd/nri` at 0.6.1, 0.8.0 and 0.12.2 (see
//! `support::reference`).
//!
//! - Against the newest upstream file: every message, field, enum value,
//!   service and RPC we define exists there with the same name, number and
//!   type.
//! - Against every upstream file: a field (or enum value, or RPC) we define
//!   that exists there, by name or by number, is identical to ours, so what
//!   we send is read the same by a runtime built with any of those versions.

// A panic in test code is a failed test, not a crash on user input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::BTreeMap;

use dra_cpu_proto::nri::api;
use prost::Message as _;
use prost_types::{DescriptorProto, FileDescriptorProto};
use support::reference::{
    compile_reference, field_type, nri, rpc_signature, Upstream, NRI_VERSIONS,
};

const PACKAGE: &str = "nri.pkg.api.v1alpha1";

/// One field: name, number and everything else that decides its encoding
/// and meaning (label, scalar type, message/enum type name, oneof).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Field {
    name: String,
    number: i32,
    shape: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Rpc {
    name: String,
    signature: String,
}

#[derive(Clone, Debug, Default)]
struct Schema {
    /// Full message name (nested ones as `.Outer.Inner`) to its fields.
    messages: BTreeMap<String, Vec<Field>>,
    /// Full enum name to its values.
    enums: BTreeMap<String, Vec<(String, i32)>>,
    /// Service name to its RPCs.
    services: BTreeMap<String, Vec<Rpc>>,
}

fn schema_of(file: &FileDescriptorProto) -> Schema {
    assert_eq!(file.package(), PACKAGE, "package of {}", file.name());
    let mut schema = Schema::default();
    let scope = format!(".{}", file.package());
    for message in &file.message_type {
        flatten_message(&scope, message, &mut schema);
    }
    for enumeration in &file.enum_type {
        add_enum(&scope, enumeration, &mut schema);
    }
    for service in &file.service {
        let rpcs = service
            .method
            .iter()
            .map(|m| Rpc {
                name: m.name().to_string(),
                signature: rpc_signature(m),
            })
            .collect();
        schema.services.insert(service.name().to_string(), rpcs);
    }
    schema
}

fn add_enum(scope: &str, enumeration: &prost_types::EnumDescriptorProto, schema: &mut Schema) {
    let values = enumeration
        .value
        .iter()
        .map(|v| (v.name().to_string(), v.number()))
        .collect();
    schema
        .enums
        .insert(format!("{scope}.{}", enumeration.name()), values);
}

fn flatten_message(scope: &str, message: &DescriptorProto, schema: &mut Schema) {
    let name = format!("{scope}.{}", message.name());
    let fields = message
        .field
        .iter()
        .map(|f| {
            // A real oneof (not the synthetic one of a proto3 `optional`).
            let oneof = match f.oneof_index {
                Some(i) if !f.proto3_optional() => {
                    format!(" oneof {}", message.oneof_decl[i as usize].name())
                }
                _ => String::new(),
            };
            Field {
                name: f.name().to_string(),
                number: f.number(),
                shape: format!("{}{oneof}", field_type(f)),
            }
        })
        .collect();
    schema.messages.insert(name.clone(), fields);
    for nested in &message.nested_type {
        flatten_message(&name, nested, schema);
    }
    for enumeration in &message.enum_type {
        add_enum(&name, enumeration, schema);
    }
}

/// Our NRI protocol, as embedded in the generated bindings.
fn ours() -> Schema {
    let bytes = protobuf::Message::write_to_bytes(api::file_descriptor().proto()).unwrap();
    let file = FileDescriptorProto::decode(bytes.as_slice()).unwrap();
    assert_eq!(file.name(), "api.proto");
    schema_of(&file)
}

/// The upstream NRI protocol files, oldest first, with their versions.
fn reference_files() -> Vec<((u32, u32, u32), Upstream)> {
    let mut files: Vec<_> = NRI_VERSIONS
        .iter()
        .map(|tag| {
            let mut parts = tag
                .strip_prefix('v')
                .unwrap()
                .split('.')
                .map(|p| p.parse::<u32>().unwrap());
            let version = (
                parts.next().unwrap(),
                parts.next().unwrap(),
                parts.next().unwrap(),
            );
            (version, nri(tag))
        })
        .collect();
    files.sort_by_key(|(version, _)| *version);
    files
}

/// Compiles one upstream protocol file with the vendored protoc.
fn compile_one(file: &Upstream) -> Schema {
    let set = compile_reference(file);
    assert_eq!(set.file.len(), 1, "{file} should import nothing");
    schema_of(&set.file[0])
}

/// What in `ours` is missing from or different in `upstream`.
fn missing_or_different(ours: &Schema, upstream: &Schema, label: &str) -> Vec<String> {
    let mut problems = Vec::new();
    for (message, fields) in &ours.messages {
        let Some(theirs) = upstream.messages.get(message) else {
            problems.push(format!("{label}: message {message} does not exist"));
            continue;
        };
        for field in fields {
            match theirs.iter().find(|f| f.name == field.name) {
                None => problems.push(format!(
                    "{label}: field {message}.{} does not exist",
                    field.name
                )),
                Some(t) if t != field => problems.push(format!(
                    "{label}: field {message}.{}: ours {field:?}, upstream {t:?}",
                    field.name
                )),
                Some(_) => {}
            }
        }
    }
    for (enumeration, values) in &ours.enums {
        let Some(theirs) = upstream.enums.get(enumeration) else {
            problems.push(format!("{label}: enum {enumeration} does not exist"));
            continue;
        };
        for value in values {
            if !theirs.contains(value) {
                problems.push(format!(
                    "{label}: enum value {enumeration}.{} = {} does not exist",
                    value.0, value.1
                ));
            }
        }
    }
    for (service, rpcs) in &ours.services {
        let Some(theirs) = upstream.services.get(service) else {
            problems.push(format!("{label}: service {service} does not exist"));
            continue;
        };
        for rpc in rpcs {
            if !theirs.contains(rpc) {
                problems.push(format!(
                    "{label}: rpc {service}.{}{} does not exist",
                    rpc.name, rpc.signature
                ));
            }
        }
    }
    problems
}

/// Event.LAST is a sentinel bounding the event numbers: it is never sent,
/// and upstream renumbers it whenever an event is added.
fn is_sentinel(enumeration: &str, value: &str) -> bool {
    enumeration == format!(".{PACKAGE}.Event") && value == "LAST"
}

/// Where `ours` and `upstream` define the same field, enum value or RPC (by
/// name or by number), how they differ. Things only one side has are fine.
fn conflicts(ours: &Schema, upstream: &Schema, label: &str) -> Vec<String> {
    let mut problems = Vec::new();
    for (message, fields) in &ours.messages {
        let Some(theirs) = upstream.messages.get(message) else {
            continue;
        };
        for field in fields {
            for t in theirs
                .iter()
                .filter(|t| t.name == field.name || t.number == field.number)
            {
                if t != field {
                    problems.push(format!(
                        "{label}: field {message}.{}: ours {field:?}, upstream {t:?}",
                        field.name
                    ));
                }
            }
        }
    }
    for (enumeration, values) in &ours.enums {
        let Some(theirs) = upstream.enums.get(enumeration) else {
            continue;
        };
        for value in values {
            for t in theirs.iter().filter(|t| t.0 == value.0 || t.1 == value.1) {
                if t != value
                    && !is_sentinel(enumeration, &t.0)
                    && !is_sentinel(enumeration, &value.0)
                {
                    problems.push(format!(
                        "{label}: enum value {enumeration}: ours {value:?}, upstream {t:?}"
                    ));
                }
            }
        }
    }
    for (service, rpcs) in &ours.services {
        let Some(theirs) = upstream.services.get(service) else {
            continue;
        };
        for rpc in rpcs {
            for t in theirs.iter().filter(|t| t.name == rpc.name) {
                if t != rpc {
                    problems.push(format!(
                        "{label}: rpc {service}: ours {rpc:?}, upstream {t:?}"
                    ));
                }
            }
        }
    }
    problems
}

fn assert_no_problems(problems: Vec<String>) {
    assert!(
        problems.is_empty(),
        "{} mismatch(es) with upstream NRI:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

#[test]
fn our_nri_protocol_is_the_runtime_and_plugin_services() {
    let ours = ours();
    let services: Vec<_> = ours.services.keys().map(String::as_str).collect();
    assert_eq!(services, ["Plugin", "Runtime"]);
    let rpcs =
        |s: &str| -> Vec<String> { ours.services[s].iter().map(|r| r.name.clone()).collect() };
    assert_eq!(rpcs("Runtime"), ["RegisterPlugin", "UpdateContainers"]);
    for rpc in [
        "Configure",
        "Synchronize",
        "Shutdown",
        "CreateContainer",
        "UpdateContainer",
        "StopContainer",
        "StateChange",
    ] {
        assert!(
            rpcs("Plugin").iter().any(|r| r == rpc),
            "Plugin.{rpc} missing"
        );
    }
    // Enough of the protocol to make the comparisons below meaningful.
    assert!(ours.messages.len() > 50, "{} messages", ours.messages.len());
    assert!(ours.messages[&format!(".{PACKAGE}.LinuxCPU")]
        .iter()
        .any(|f| f.name == "cpus" && f.number == 6));
}

#[test]
fn every_nri_definition_exists_in_the_newest_upstream() {
    let (version, newest) = reference_files().pop().unwrap();
    let upstream = compile_one(&newest);
    assert!(upstream.services.contains_key("Runtime"));
    assert!(upstream.services.contains_key("Plugin"));
    assert_no_problems(missing_or_different(
        &ours(),
        &upstream,
        &format!("NRI {version:?}"),
    ));
}

#[test]
fn every_nri_definition_agrees_with_every_upstream_version() {
    let ours = ours();
    let mut problems = Vec::new();
    for (version, file) in reference_files() {
        let upstream = compile_one(&file);
        // The messages and RPCs of the 0.6 protocol all exist in every
        // version: a version we share nothing with would check nothing.
        for message in ["RegisterPluginRequest", "ContainerUpdate", "LinuxCPU"] {
            assert!(
                upstream
                    .messages
                    .contains_key(&format!(".{PACKAGE}.{message}")),
                "{file} has no {message}"
            );
        }
        problems.extend(conflicts(&ours, &upstream, &format!("NRI {version:?}")));
    }
    assert_no_problems(problems);
}

type Mutation<'a> = Box<dyn Fn(&mut Schema) + 'a>;

/// The comparisons find a renumbered field, a retyped field, an unknown
/// field, a renamed RPC and a renumbered enum value.
#[test]
fn the_comparison_finds_mismatches() {
    let (_, newest) = reference_files().pop().unwrap();
    let upstream = compile_one(&newest);
    let (_, oldest) = reference_files().remove(0);
    let oldest = compile_one(&oldest);
    let cpu = format!(".{PACKAGE}.LinuxCPU");
    let mutations: Vec<(&str, Mutation<'_>)> = vec![
        (
            "renumbered field",
            Box::new(|s: &mut Schema| {
                let f = s.messages.get_mut(&cpu).unwrap();
                f.iter_mut().find(|f| f.name == "cpus").unwrap().number = 99;
            }),
        ),
        (
            "retyped field",
            Box::new(|s: &mut Schema| {
                let f = s.messages.get_mut(&cpu).unwrap();
                f.iter_mut().find(|f| f.name == "mems").unwrap().shape = "Bytes ".into();
            }),
        ),
        (
            "field reusing a number",
            Box::new(|s: &mut Schema| {
                s.messages.get_mut(&cpu).unwrap().push(Field {
                    name: "cpuset".into(),
                    number: 6,
                    shape: "String ".into(),
                });
            }),
        ),
        (
            "renamed rpc",
            Box::new(|s: &mut Schema| {
                s.services.get_mut("Runtime").unwrap()[0].name = "Register".into();
            }),
        ),
        (
            "renumbered enum value",
            Box::new(|s: &mut Schema| {
                let e = s.enums.get_mut(&format!(".{PACKAGE}.Event")).unwrap();
                e.iter_mut().find(|v| v.0 == "CREATE_CONTAINER").unwrap().1 = 7;
            }),
        ),
    ];
    for (what, mutate) in mutations {
        let mut changed = ours();
        mutate(&mut changed);
        assert!(
            !missing_or_different(&changed, &upstream, "newest").is_empty(),
            "newest-version check missed a {what}"
        );
        if what != "renamed rpc" {
            assert!(
                !conflicts(&changed, &oldest, "oldest").is_empty(),
                "every-version check missed a {what}"
            );
        }
    }
}
